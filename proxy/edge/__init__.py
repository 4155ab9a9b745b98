"""The edge: Tornado handlers for the WebSocket doors and the HTTP routes, who may connect and
which lever each credential opens, and the bounds on connections."""
