"""Why a job hung, from its ranks' flight-recorder dumps and stacks: ``python -m bench.hang DIR``.

Reading side: it reads dump files (torch's flight-recorder format, and the suite's
``stacks_rank<N>.json``), from this suite's run folders (``hangs/<point>/``) or from any job
run with ``TORCH_FR_BUFFER_SIZE`` and ``TORCH_FR_DUMP_TEMP_FILE``.
"""

from bench.hang.diagnose import Diagnosis, diagnose, diagnose_folder
from bench.hang.dumps import DumpError, Dumps, load

__all__ = ["Diagnosis", "DumpError", "Dumps", "diagnose", "diagnose_folder", "load"]
