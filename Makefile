# The two commands of the README: `make serve` and `make test`. Both create .venv (torch
# pinned and installed first, the rest under constraints): `make serve` (and the Docker
# image, `make install`) the runtime alone; `make test` adds the dev extras to it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install install-dev serve test test-fast docs clean distill

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e .
	$(BIN)/pip check
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/pip check
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

serve: install
	$(BIN)/distilserve serve

# both on every core (at most 4 workers), a test module on one worker (its module-scoped
# fixtures made once), the modules with the most tests first
PYTEST := $(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadscope

test: install-dev
	$(PYTEST)

# the inner loop: every test not marked slow (real servers in subprocesses, Ray, training,
# the default's build, schemathesis)
test-fast: install-dev
	$(PYTEST) -m "not slow"

# the documentation site, built and served locally as it is edited
docs: install-dev
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

clean:
	rm -rf $(VENV)

# Distils MiniLM into a student of each family and adds them to the default repository
# (how long each took: the docs' results pages). STEPS=N to change the length.
distill: install
	for family in bert minialbert falbert cmow; do \
		$(BIN)/distilserve distill $$family --output students/$$family $(if $(STEPS),--steps $(STEPS)) --add-to-default || exit 1; \
	done
