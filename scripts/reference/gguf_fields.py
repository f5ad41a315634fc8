"""Copies a GGUF's metadata to a writer: shared by widen-gguf.py and truncate-gguf.py."""
import gguf


def copy_fields(r, w, override):
    """Every field of reader `r` into writer `w` (except GGUF.* and the architecture, which the
    writer holds); `override(name)` returns a uint32 to write instead, or None to copy."""
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = f.types[0]
        value = override(name)
        if value is not None:
            w.add_uint32(name, value)
        elif kind == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data])
            else:
                w.add_array(name, [f.parts[i].tolist()[0] for i in f.data])
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode())
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], kind)
