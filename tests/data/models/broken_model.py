"""A model file that fails at import (tests/test_user_model.py)."""

raise ImportError("this model file needs a package that is not installed")
