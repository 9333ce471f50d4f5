"""The Dockerfile, Makefile and CI use the one install recipe and the one entry point."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_dockerfile_uses_setup_script_and_app_entry_point():
    docker = (ROOT / "Dockerfile").read_text()
    assert "scripts/setup.sh" in docker
    assert 'CMD ["python", "app.py"]' in docker
    assert "--uid 1000" in docker and "EXPOSE 7860" in docker
    assert "GRADIO_SERVER_NAME=0.0.0.0" in docker


def test_dockerfile_copies_what_setup_reads_before_running_it():
    lines = [line.split() for line in (ROOT / "Dockerfile").read_text().splitlines() if line.strip()]
    first_setup = next(i for i, words in enumerate(lines) if words[:2] == ["RUN", "scripts/setup.sh"])
    copied = {src for words in lines[:first_setup] if words[0] == "COPY" for src in words[1:-1]
              if not src.startswith("--")}
    read = set(re.findall(r"-r (\S+\.txt)", (ROOT / "scripts" / "setup.sh").read_text()))
    assert read == {"requirements.txt", "requirements-dev.txt", "requirements-peers.txt", "requirements-cluster.txt"}
    assert read | {"scripts/"} <= copied
    convert = next(i for i, words in enumerate(lines) if words[:3] == ["RUN", "scripts/setup.sh", "--convert"])
    copy_all = next(i for i, words in enumerate(lines) if words[0] == "COPY" and words[-2:] == [".", "."])
    assert first_setup < copy_all < convert, "the recipe runs before the code is copied, the conversion after"
    assert "HF_HUB_OFFLINE=1" in (ROOT / "Dockerfile").read_text(), "the image holds its model: it runs offline"


def test_package_metadata_names_the_licence_and_the_command():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "MIT" and "license: mit" in (ROOT / "README.md").read_text().split("---")[1]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert project["scripts"] == {"codeckv": "codeckv.cli:main"}
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "codeckv.__version__"}
    assert {"app", "gemma", "dev", "cluster"} <= set(project["optional-dependencies"])
    ray = [line for line in (ROOT / "requirements-cluster.txt").read_text().splitlines() if line.startswith("ray")]
    assert project["optional-dependencies"]["cluster"] == ray == ["ray==2.60.0"], "one pin for the cluster extra"
    assert "ray" not in (ROOT / "requirements.txt").read_text(), "the Space never installs Ray"


def test_makefile_and_ci_use_setup_script():
    makefile = (ROOT / "Makefile").read_text()
    assert "scripts/setup.sh --dev" in makefile and "app.py" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_requirements_pin_the_stack():
    pins = (ROOT / "requirements.txt").read_text()
    for pin in ["torch==2.13.0", "transformers==5.24.0", "gradio==6.31.0", "plotly==7.1.0", "gguf==0.19.0"]:
        assert pin in pins, pin


def test_readme_front_matter_is_a_gradio_space():
    readme = (ROOT / "README.md").read_text()
    front = readme.split("---")[1]
    for key in ["title:", "emoji:", "colorFrom:", "colorTo:", "sdk: gradio", "app_file: app.py", "license:"]:
        assert key in front, key
    assert readme.index("make run") < readme.index("make test") < readme.index("## ")


def test_docker_context_leaves_the_local_venv_out():
    assert ".venv/" in (ROOT / ".dockerignore").read_text().split()
