"""torch's own distributed test suite (DistributedTest, shipped in the torch wheel) on
the backend named by BACKEND, as torch's test_distributed_spawn.py runs it:

    BACKEND=ringccl WORLD_SIZE=2 python -m pytest -q python/suite/torch_distributed_suite.py

scripts/torch-suite.sh runs it for ringccl and for gloo and prints the counts side by
side. It is a measurement, not part of the test command (about 40 minutes per backend
on a 2-core machine).
"""

import os
import sys
import tempfile

os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="torch-suite-"))
if "BACKEND" not in os.environ:
    sys.exit("set BACKEND (ringccl or gloo)")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
