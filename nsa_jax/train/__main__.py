"""``python -m nsa_jax.train``: see :mod:`nsa_jax.train.cli`."""
from nsa_jax.train.cli import main

raise SystemExit(main())
