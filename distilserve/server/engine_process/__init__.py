"""One engine process holding every model, fed by the front-end worker processes of
``distilserve serve --workers N --engine shared``."""
