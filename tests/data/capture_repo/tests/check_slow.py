import os
import time

import pytest
from capture_ops import scale


def test_quick():
    assert scale(1.5) == 3.0


@pytest.mark.skipif(os.environ.get("KFCAP_SLOW") != "1", reason="only for the timeout test")
def test_sleeps():
    time.sleep(120)
