#!/usr/bin/env python3
"""Render a crate's rustdoc JSON as a sorted text listing of its public API.

Usage: api.py CRATE.json [DEPENDENCY.json ...] > api/CRATE.txt

The dependencies' JSON (optional) turns the paths where their items are defined (which may be
private modules) into the paths where users name them.

One line per public item, reachable from the crate root through public modules and re-exports:
modules, types, traits, functions and methods with their generics and bounds, struct fields, enum
variants, trait items, constants, and the impls of traits on public types (derived and auto-trait
impls included: losing `Send` or `Clone` is a change of API; blanket impls excluded). Items marked
`#[doc(hidden)]` are not in rustdoc's JSON, so they are not in the listing: they are not part of
the stable API. Paths are the public ones (where a user names the item), not where it is defined.

Written for rustdoc JSON format version 57 (Rust 1.95); the format is unstable, so a newer
toolchain may need small changes here (the script stops on a version it was not written for).
"""

import json
import sys

FORMAT_VERSIONS = {57}

# Compiler-internal marker traits that rustdoc lists among auto-trait and derived impls: not API.
INTERNAL_TRAITS = {"core::marker::Freeze", "core::marker::UnsafeUnpin",
                   "core::marker::StructuralPartialEq"}


class Api:
    def __init__(self, doc):
        self.doc = doc
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.public = {}  # id -> public path (shortest, then alphabetically first)
        self.lines = set()  # (sort key: the item's path, line)
        self.owner = ""
        self.external = {}  # defined path of a dependency's item -> its public path

    def learn(self, dep):
        """Maps the dependency's items from where they are defined to where they are public."""
        other = Api(dep)
        root = dep["root"]
        other.collect(root, [other.item(root)["name"]], set())
        for id_, path in other.public.items():
            p = dep["paths"].get(str(id_))
            if p is not None:
                self.external["::".join(p["path"])] = "::".join(path)

    # ---- walking the public tree ----------------------------------------------------------

    def item(self, id_):
        return self.index.get(str(id_))

    def collect(self, id_, path, seen):
        """Records the public path of every item reachable from module `id_`."""
        if id_ in seen:
            return
        seen.add(id_)
        module = self.item(id_)["inner"]["module"]
        for child_id in module["items"]:
            child = self.item(child_id)
            if child is None:
                continue
            kind, inner = next(iter(child["inner"].items()))
            if kind == "use":
                target = inner["id"]
                if inner["is_glob"]:
                    t = self.item(target) if target is not None else None
                    if t is not None and "module" in t["inner"]:
                        self.collect(target, path, seen)
                    continue
                self.note(target, path + [inner["name"]], seen)
            elif child.get("name") is not None:
                self.note(child_id, path + [child["name"]], seen)

    def note(self, id_, path, seen):
        key = (len(path), path)
        if id_ is not None:
            old = self.public.get(id_)
            if old is None or key < (len(old), old):
                self.public[id_] = path
        t = self.item(id_) if id_ is not None else None
        if t is not None and "module" in t["inner"]:
            self.collect(id_, path, seen)

    # ---- rendering types --------------------------------------------------------------------

    def path_of(self, id_, written):
        if id_ is not None:
            if id_ in self.public:
                return "::".join(self.public[id_])
            p = self.paths.get(str(id_))
            if p is not None:
                defined = "::".join(p["path"])
                return self.external.get(defined, defined)
        return written

    def ty(self, t):
        if t is None:
            return "()"
        if isinstance(t, str):
            return "_" if t == "infer" else t
        kind, v = next(iter(t.items()))
        if kind == "resolved_path":
            return self.rpath(v)
        if kind == "generic":
            return v
        if kind == "primitive":
            return v
        if kind == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ("," if len(v) == 1 else "") + ")"
        if kind == "slice":
            return "[" + self.ty(v) + "]"
        if kind == "array":
            return "[" + self.ty(v["type"]) + "; " + v["len"] + "]"
        if kind == "borrowed_ref":
            lt = (v["lifetime"] + " ") if v["lifetime"] else ""
            return "&" + lt + ("mut " if v["is_mutable"] else "") + self.ty(v["type"])
        if kind == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(v["type"])
        if kind == "dyn_trait":
            parts = [self.poly(p) for p in v["traits"]]
            if v.get("lifetime"):
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if kind == "impl_trait":
            return "impl " + self.bounds(v)
        if kind == "function_pointer":
            sig = v["sig"]
            args = ", ".join(self.ty(a[1]) for a in sig["inputs"])
            out = "" if sig["output"] is None else " -> " + self.ty(sig["output"])
            return self.hrtb(v.get("generic_params", [])) + "fn(" + args + ")" + out
        if kind == "qualified_path":
            self_ty = self.ty(v["self_type"])
            name = v["name"] + self.args(v.get("args"))
            if v.get("trait") is None:
                return self_ty + "::" + name
            return "<" + self_ty + " as " + self.rpath(v["trait"]) + ">::" + name
        if kind == "pat":
            return self.ty(v["type"])
        return json.dumps(t, sort_keys=True)

    def rpath(self, p):
        return self.path_of(p.get("id"), p["path"]) + self.args(p.get("args"))

    def args(self, a):
        if a is None:
            return ""
        if isinstance(a, str):
            return "(..)"
        kind, v = next(iter(a.items()))
        if kind == "parenthesized":
            out = "" if v["output"] is None else " -> " + self.ty(v["output"])
            return "(" + ", ".join(self.ty(x) for x in v["inputs"]) + ")" + out
        parts = []
        for g in v["args"]:
            if isinstance(g, str):
                parts.append("_")
                continue
            gk, gv = next(iter(g.items()))
            if gk == "lifetime":
                parts.append(gv)
            elif gk == "type":
                parts.append(self.ty(gv))
            elif gk == "const":
                parts.append(gv.get("expr") or "{const}")
        for c in v.get("constraints", []):
            name = c["name"] + self.args(c.get("args"))
            bk, bv = next(iter(c["binding"].items()))
            if bk == "equality":
                term = bv.get("type") if isinstance(bv, dict) and "type" in bv else bv
                parts.append(name + " = " + self.ty(term))
            else:
                parts.append(name + ": " + self.bounds(bv))
        return "<" + ", ".join(parts) + ">" if parts else ""

    def hrtb(self, params):
        if not params:
            return ""
        return "for<" + ", ".join(self.param(p) for p in params) + "> "

    def poly(self, p):
        return self.hrtb(p.get("generic_params", [])) + self.rpath(p["trait"])

    def bounds(self, bs):
        out = []
        for b in bs:
            if isinstance(b, str):
                out.append(b)
                continue
            kind, v = next(iter(b.items()))
            if kind == "trait_bound":
                m = {"maybe": "?", "maybe_const": "~const "}.get(v["modifier"], "")
                out.append(m + self.hrtb(v.get("generic_params", [])) + self.rpath(v["trait"]))
            elif kind == "outlives":
                out.append(v)
            elif kind == "use":
                out.append("use<" + ", ".join(x if isinstance(x, str) else
                                             next(iter(x.values())) for x in v) + ">")
        return " + ".join(out)

    def param(self, p):
        kind, v = next(iter(p["kind"].items()))
        if kind == "lifetime":
            return p["name"] + (": " + " + ".join(v["outlives"]) if v["outlives"] else "")
        if kind == "type":
            s = p["name"]
            if v["bounds"]:
                s += ": " + self.bounds(v["bounds"])
            if v.get("default") is not None:
                s += " = " + self.ty(v["default"])
            return s
        s = "const " + p["name"] + ": " + self.ty(v["type"])
        if v.get("default") is not None:
            s += " = " + v["default"]
        return s

    def generics(self, g, skip_synthetic=True):
        params = [p for p in g["params"]
                  if not (skip_synthetic and p["kind"].get("type", {}).get("is_synthetic"))]
        return "<" + ", ".join(self.param(p) for p in params) + ">" if params else ""

    def where(self, g):
        preds = []
        for w in g["where_predicates"]:
            kind, v = next(iter(w.items()))
            if kind == "bound_predicate":
                preds.append(self.hrtb(v.get("generic_params", [])) + self.ty(v["type"]) + ": "
                             + self.bounds(v["bounds"]))
            elif kind == "lifetime_predicate":
                preds.append(v["lifetime"] + ": " + " + ".join(v["outlives"]))
            elif kind == "eq_predicate":
                rhs = v["rhs"].get("type", v["rhs"]) if isinstance(v["rhs"], dict) else v["rhs"]
                preds.append(self.ty(v["lhs"]) + " == " + self.ty(rhs))
        return " where " + ", ".join(preds) if preds else ""

    def fn(self, name, f):
        h = f["header"]
        quals = "".join(q for q, on in (("const ", h["is_const"]), ("async ", h["is_async"]),
                                        ("unsafe ", h["is_unsafe"])) if on)
        args = []
        for arg_name, t in f["sig"]["inputs"]:
            if arg_name == "self":
                s = self.ty(t)
                args.append({"Self": "self", "&Self": "&self", "&mut Self": "&mut self"}
                            .get(s, "self: " + s))
            else:
                args.append(arg_name + ": " + self.ty(t))
        out = f["sig"]["output"]
        ret = "" if out is None else " -> " + self.ty(out)
        return (quals + "fn " + name + self.generics(f["generics"]) + "(" + ", ".join(args) + ")"
                + ret + self.where(f["generics"]))

    # ---- listing --------------------------------------------------------------------------

    def emit(self, line, rank=2):
        # Within an item: its declaration, then fields and variants, then methods, then impls.
        if line.startswith(("impl", "unsafe impl")):
            rank = 3
        self.lines.add((self.owner, rank, line))

    def attrs(self, item):
        out = []
        for a in item.get("attrs", []):
            if a == "non_exhaustive" or a == {"non_exhaustive": None}:
                out.append("#[non_exhaustive] ")
        return "".join(out)

    def render(self):
        for id_, path in sorted(self.public.items(), key=lambda kv: kv[1]):
            item = self.item(id_)
            p = "::".join(path)
            if item is None:
                # A re-export of an item from another crate that rustdoc did not inline.
                ext = self.paths.get(str(id_))
                src = "::".join(ext["path"]) if ext else "?"
                src = self.external.get(src, src)
                self.emit("pub use " + p + " = " + src)
                continue
            if self.public_path_of(id_) != path:
                # Also reachable elsewhere: list the alias, render the item once.
                self.emit("pub use " + p + " = " + "::".join(self.public[id_]))
                continue
            self.render_item(p, item)
        return [line for _, _, line in sorted(self.lines)]

    def public_path_of(self, id_):
        return self.public.get(id_)

    def render_item(self, p, item):
        self.owner = p
        kind, v = next(iter(item["inner"].items()))
        a = self.attrs(item)
        if kind == "module":
            self.emit("pub mod " + p)
        elif kind == "function":
            self.emit("pub " + self.fn(p, v))
        elif kind == "constant":
            self.emit("pub const " + p + ": " + self.ty(v["type"]))
        elif kind == "static":
            self.emit("pub static " + p + ": " + self.ty(v["type"]))
        elif kind == "type_alias":
            self.emit("pub type " + p + self.generics(v["generics"]) + " = " + self.ty(v["type"])
                      + self.where(v["generics"]))
        elif kind == "macro":
            self.emit("pub macro " + p + "!")
        elif kind == "struct":
            g = v["generics"]
            sk = v["kind"]
            if sk == "unit":
                shape = ";"
            elif "tuple" in sk:
                fields = ["pub " + self.ty(self.item(f)["inner"]["struct_field"])
                          if f is not None else "_" for f in sk["tuple"]]
                shape = "(" + ", ".join(fields) + ")"
            else:
                shape = " {..}" if sk["plain"]["has_stripped_fields"] or not sk["plain"]["fields"] \
                    else ""
                for f in sk["plain"]["fields"]:
                    fi = self.item(f)
                    self.emit("pub " + p + "::" + fi["name"] + ": "
                              + self.ty(fi["inner"]["struct_field"]), 1)
            self.emit(a + "pub struct " + p + self.generics(g) + shape + self.where(g), 0)
            self.impls(p, v["impls"])
        elif kind == "union":
            self.emit(a + "pub union " + p + self.generics(v["generics"]), 0)
            self.impls(p, v["impls"])
        elif kind == "enum":
            g = v["generics"]
            self.emit(a + "pub enum " + p + self.generics(g) + self.where(g), 0)
            for var in v["variants"]:
                vi = self.item(var)
                vk = vi["inner"]["variant"]["kind"]
                vp = p + "::" + vi["name"]
                if vk == "plain":
                    self.emit(self.attrs(vi) + "pub variant " + vp, 1)
                elif "tuple" in vk:
                    fields = [self.ty(self.item(f)["inner"]["struct_field"]) if f is not None
                              else "_" for f in vk["tuple"]]
                    self.emit(self.attrs(vi) + "pub variant " + vp + "(" + ", ".join(fields) + ")", 1)
                else:
                    self.emit(self.attrs(vi) + "pub variant " + vp + " {..}", 1)
                    for f in vk["struct"]["fields"]:
                        fi = self.item(f)
                        self.emit("pub " + vp + "::" + fi["name"] + ": "
                                  + self.ty(fi["inner"]["struct_field"]), 1)
            self.impls(p, v["impls"])
        elif kind == "trait":
            g = v["generics"]
            sup = (": " + self.bounds(v["bounds"])) if v["bounds"] else ""
            unsafe = "unsafe " if v["is_unsafe"] else ""
            self.emit("pub " + unsafe + "trait " + p + self.generics(g) + sup + self.where(g), 0)
            for i in v["items"]:
                self.assoc(p, self.item(i), "trait ")
            for i in v["implementations"]:
                im = self.item(i)
                if im is None:
                    continue
                x = im["inner"]["impl"]
                if x["blanket_impl"] is not None or x["is_synthetic"]:
                    continue
                for_ty = x["for"]
                tid = for_ty.get("resolved_path", {}).get("id") if isinstance(for_ty, dict) \
                    else None
                if tid is not None and tid in self.public:
                    continue  # listed with the type
                self.emit(self.impl_line(x))
        elif kind == "trait_alias":
            self.emit("pub trait " + p + " = " + self.bounds(v["params"]))
        else:
            self.emit("pub " + kind + " " + p)

    def assoc(self, owner, it, prefix, suffix=""):
        if it is None:
            return
        kind, v = next(iter(it["inner"].items()))
        p = owner + "::" + it["name"]
        if kind == "function":
            provided = " {provided}" if prefix == "trait " and v["has_body"] else ""
            self.emit("pub " + prefix + self.fn(p, v) + provided + suffix)
        elif kind == "assoc_const":
            self.emit("pub " + prefix + "const " + p + ": " + self.ty(v["type"]) + suffix)
        elif kind == "assoc_type":
            b = (": " + self.bounds(v["bounds"])) if v["bounds"] else ""
            t = (" = " + self.ty(v["type"])) if v.get("type") is not None else ""
            self.emit("pub " + prefix + "type " + p + self.generics(v["generics"]) + b + t)

    def impl_line(self, x):
        neg = "!" if x["is_negative"] else ""
        unsafe = "unsafe " if x["is_unsafe"] else ""
        return (unsafe + "impl" + self.generics(x["generics"], skip_synthetic=False) + " " + neg
                + self.rpath(x["trait"]) + " for " + self.ty(x["for"]) + self.where(x["generics"]))

    def impls(self, p, ids):
        for i in ids:
            im = self.item(i)
            if im is None:
                continue
            x = im["inner"]["impl"]
            if x["blanket_impl"] is not None:
                continue
            if x["trait"] is None:
                owner, where = p, ""
                if x["generics"]["params"]:
                    # Methods of `impl<T: Bound> Type<T>`: the impl's bounds are part of them.
                    owner = self.ty(x["for"])
                    preds = [q["name"] + ": " + self.bounds(q["kind"]["type"]["bounds"])
                             for q in x["generics"]["params"]
                             if "type" in q["kind"] and q["kind"]["type"]["bounds"]]
                    rest = self.where(x["generics"])
                    if rest:
                        preds.append(rest[len(" where "):])
                    if preds:
                        where = " (impl where " + ", ".join(preds) + ")"
                for a in x["items"]:
                    ai = self.item(a)
                    if ai is not None and ai["visibility"] == "public":
                        self.assoc(owner, ai, "", where)
            elif self.path_of(x["trait"].get("id"), x["trait"]["path"]) not in INTERNAL_TRAITS:
                self.emit(self.impl_line(x))


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    if doc["format_version"] not in FORMAT_VERSIONS:
        sys.exit(f"api.py: rustdoc JSON format {doc['format_version']} is not one this script "
                 f"was written for ({sorted(FORMAT_VERSIONS)}); check the listing and update it")
    api = Api(doc)
    for dep_file in sys.argv[2:]:
        with open(dep_file) as f:
            api.learn(json.load(f))
    root = doc["root"]
    api.collect(root, [api.item(root)["name"]], set())
    sys.stdout.write("".join(line + "\n" for line in api.render()))


if __name__ == "__main__":
    main()
