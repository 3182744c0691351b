from topiclake.cli import main

raise SystemExit(main())
