"""The project's one tolerance table lives in torchtpu/_tolerances.py (the validation
command needs it outside the tests); the tests import it from here."""
from torchtpu._tolerances import *  # noqa: F401,F403
from torchtpu._tolerances import OP_TOLERANCES, TOLERANCES, assert_close, op_tol, tol  # noqa: F401
