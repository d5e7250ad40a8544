# The two commands of the README: `make serve` and `make test`. Both create the same
# virtual environment (torch pinned and installed first, the rest under constraints).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install serve test clean distill

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/pip check
	touch $@

install: $(VENV)/.installed

serve: install
	$(BIN)/distilserve serve

test: install
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV)

# Distils MiniLM into a student of each family and adds them to the default repository
# (12-19 minutes per family on 2 cores). STEPS=N to change the length.
distill: install
	for family in bert minialbert falbert cmow; do \
		$(BIN)/distilserve distill $$family --output students/$$family $(if $(STEPS),--steps $(STEPS)) --add-to-default || exit 1; \
	done
