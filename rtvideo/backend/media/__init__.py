"""Media in and out of a session: a start's `image_reference` fetched and decoded
(`image_reference`), and the frames encoded to fragmented MP4 (`encoder`)."""
