"""Who is attached to a session (owner, watchers, steerers) and the doors that attach them:
resume, watch and steer tokens, the grace, the replay of what was handed out."""
