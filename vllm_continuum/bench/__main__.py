from vllm_continuum.bench.cli import main

raise SystemExit(main())
