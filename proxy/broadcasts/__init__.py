"""Broadcasts: a session's stream as an HLS playlist of its CMAF fragments, written to a folder
or an object store for spectators (a CDN) to read, and served by the proxy from a folder."""
