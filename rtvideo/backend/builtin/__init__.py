"""The built-in generator: a seeded scene renderer conditioned on a real text encoder, the fMP4 encoding, and the render worker processes."""
