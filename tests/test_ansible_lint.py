"""The deploy playbook passes ansible-lint at the `production` profile (ansible/.ansible-lint)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, require

pytestmark = [pytest.mark.process, pytest.mark.first]  # one long test: started early

LINT = Path(sys.executable).parent / "ansible-lint"


def test_the_deploy_playbook_passes_ansible_lint_at_the_production_profile():
    require(LINT.exists(), "ansible-lint is not installed (pip install -e '.[dev]')")
    env = {
        **os.environ,
        "PATH": f"{LINT.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "NO_COLOR": "1",
    }
    result = subprocess.run(
        [str(LINT), "--offline", "--profile", "production", "--nocolor"],
        cwd=REPO / "ansible",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Profile 'production' was required, and it passed" in output
