"""The compacting APIs, one package per wire format; `registry` names them."""
