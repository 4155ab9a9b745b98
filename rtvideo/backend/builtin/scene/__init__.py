"""What the built-in generator draws: a scene derived from the prompt's meaning.

A prompt's MiniLM embedding is compared (cosine) with a fixed vocabulary of concept
phrases, embedded once at start-up by the same text encoder. The similarities give
concept weights: a light (day, sunset, night, fog, storm, indoors), a ground (water,
grass, sand, snow, street, rock, floor), elements (trees, buildings, mountains, fire,
falling snow, rain, lights, a lighthouse, a vehicle, a creature) and an accent colour.
From those weights come the scene parameters: one RGB coefficient per feature image of
`SceneLayout` (sky gradient, sun, moon, stars, clouds, ground, waves, silhouettes,
flames, snowflakes, ...). A frame is the sum of the feature images weighted by their
coefficients, clipped to [0, 1].

The weights are a nonlinear function of one prompt's embedding, so they are computed
per prompt; a chunk that mixes prompts (a transition) uses the same convex mix of the
prompts' parameter matrices. Every pixel is affine in the parameters before a monotone
clip, so a transition moves every pixel monotonically from one scene to the other, and
the mix is exact (mixing the parameters of {A: 1-a, B: a} is what the chunk renders).

Geometry (horizon, sun position, tree line, skyline, where the fire or the lighthouse
stands, texture phases) comes from the session's seed and never from the prompt, so
the scene morphs in place when the prompt changes.

The package, by stage: `concepts` (prompt embedding → `SceneWeights`), `parameters`
(`SceneWeights` → one RGB coefficient per feature image), `textures` (noise textures and
numeric helpers), `camera` (depth layers seen from a pose), `layout` (a session's feature
images and their rendering).
"""
