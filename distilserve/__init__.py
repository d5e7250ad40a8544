"""distilserve: serving for compact, distilled text encoders.

``distilserve.models`` (the families, export, runtimes) <- ``distilserve.server`` (the
service and its protocols) <- its CLI; ``distilserve.training`` and ``distilserve.bench``
sit above what they use; ``distilserve.client`` is the HTTP client and imports neither."""
