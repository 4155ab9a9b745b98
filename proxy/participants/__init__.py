"""Who is attached to a session (owner, watchers, steerers) and what outlives the owner's socket:
the links and their outboxes, the owner's seat, the guest hubs, the resume, watch and steer
tokens and the invitations that hand them out, what the owner was handed (handouts) and the
replay of it."""
