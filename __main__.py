"""`python -m mmspec ...` is the `mmspec` command (so launchers that take a module can run it:
`accelerate launch -m mmspec batch ...`, `torchrun -m mmspec batch ...`)."""

from mmspec.common.cli import main

raise SystemExit(main())
