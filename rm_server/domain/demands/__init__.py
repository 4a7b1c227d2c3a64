"""Time-aware demands, pure, after Wang Jian's paper on extending Hadoop YARN resource
requests and allocation with time factors: the condition language (`syntax`, `timelang`,
`evaluation`, `codec`), the state machine (`state`) and the planner (`planner`). No I/O
here."""
