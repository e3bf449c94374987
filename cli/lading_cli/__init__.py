"""
The `lading` command: one console script that wires the core and the components.

    main.py      argument parsing and dispatch
    local.py     `lading run`: the whole system on one machine
    progress.py  live progress for people, plain lines for logs
"""
