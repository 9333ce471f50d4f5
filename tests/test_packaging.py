"""The Dockerfile, Makefile and CI use the one install recipe and the one entry point."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dockerfile_uses_setup_script_and_app_entry_point():
    docker = (ROOT / "Dockerfile").read_text()
    assert "scripts/setup.sh" in docker
    assert 'CMD ["python", "app.py"]' in docker
    assert "--uid 1000" in docker and "EXPOSE 7860" in docker
    assert "GRADIO_SERVER_NAME=0.0.0.0" in docker


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
