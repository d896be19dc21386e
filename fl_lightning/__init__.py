"""fl_lightning: federated learning on label-skewed data with one-vs-all and open-set detectors."""

from pathlib import Path as _Path

__version__ = "0.1.0"

# The loop's callbacks live in the checkout's top-level callbacks/ folder but are the package
# fl_lightning.callbacks: an installed copy maps the folder there (pyproject.toml's package-dir);
# a source checkout on PYTHONPATH (no installation) finds it through this package's search path.
_CHECKOUT = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "callbacks").is_dir() and (_CHECKOUT / "pyproject.toml").is_file() \
        and (_CHECKOUT / "callbacks" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))
