"""The pure core: places, placement rules and organization rules.

No I/O, no clock, no Kubernetes, and no import of the rest of ``o41``: every rule is a
function of plain data, so it is tested with examples and hypothesis properties alone.
"""
