"""A shim, not easyocr: importable so that OSWorld's metrics module imports; ``Reader`` refuses, naming why.

bunshin's osworld extra installs OSWorld's judge without torch; the one metric that reads text from an image
(``compare_image_text``) needs the real easyocr (``pip install easyocr``, which replaces this)."""


class Reader:
    def __init__(self, *args: object, **kwargs: object):
        raise RuntimeError("easyocr is bunshin's shim (the osworld extra has no torch): OSWorld's image-text metric "
                           "needs the real easyocr; pip install easyocr")
