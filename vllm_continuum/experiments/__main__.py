from vllm_continuum.experiments.cli import main

raise SystemExit(main())
