"""The core never imports the optional frameworks: every pal_hpc module outside
pal_hpc.integrations.sb3/.torchrl imports in a fresh interpreter with neither
stable_baselines3 nor torchrl (nor tensordict) loaded afterwards."""

import json
import subprocess
import sys

PROBE = r"""
import importlib, json, pkgutil, sys
import pal_hpc
# __main__ modules run their CLI when imported: they are entry points, not library code.
names = sorted(m.name for m in pkgutil.walk_packages(pal_hpc.__path__, "pal_hpc.")
               if m.name not in ("pal_hpc.integrations.sb3", "pal_hpc.integrations.torchrl")
               and not m.name.endswith(".__main__"))
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules
                if m.split(".")[0] in ("stable_baselines3", "torchrl", "tensordict"))
print(json.dumps({"imported": names, "loaded": loaded}))
"""


def test_core_imports_no_framework():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "pal_hpc.main" in result["imported"]
    assert "pal_hpc.integrations.per" in result["imported"]
    assert len(result["imported"]) > 20
    assert result["loaded"] == []
