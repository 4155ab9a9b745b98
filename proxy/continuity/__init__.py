"""What a takeover writes and reads (docs/operations.md "When a proxy dies"): the record a
shared session store keeps of one session (`record`), the session's writes to it as they happen
(`writer`), and the read side, a resume that reaches a replica which does not hold its session
(`takeover`). Below the session and its participants: it knows them only through narrow seams
(`takeover.Takeable`); the session reads a record back into its own parts
(rtvideo.proxy.session.restore).
"""
