# Sourced by the scripts: a project venv in .venv with this project and its tools installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# tox needs python3.10 .. python3.13 on PATH; pyenv keeps them under ~/.pyenv/versions.
for interpreter in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[0-3]*/bin; do
    [ -d "$interpreter" ] && PATH="$PATH:$interpreter"
done
export PATH="$PWD/.venv/bin:$PATH"
