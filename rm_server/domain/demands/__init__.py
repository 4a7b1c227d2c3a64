"""Time-aware demands (seed 003), pure: the condition language (`syntax`, `timelang`,
`codec`), the state machine (`state`) and the planner (`planner`). No I/O here."""
