"""``python -m specdec.bench``: the speculative decoding benchmark (see :mod:`specdec.bench.speculative`)."""

from specdec.bench.speculative import main

raise SystemExit(main())
