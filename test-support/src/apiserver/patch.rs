//! Patches: JSON merge patch (RFC 7386) and JSON Patch (RFC 6902), with the semantics of the
//! library the API server applies them with (evanphx/json-patch): a `test` of a missing path
//! against `null` passes (kube-runtime's `finalizer()` relies on it), and a patch applies
//! atomically or not at all.

use serde_json::{Map, Value, json};

/// Recursive JSON merge patch (RFC 7386).
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().unwrap();
    for (k, v) in patch {
        if v.is_null() {
            target.remove(k);
        } else {
            merge(target.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Why a JSON Patch was refused.
#[derive(Debug)]
pub(crate) enum PatchError {
    /// Not a JSON Patch document at all (the API server answers 400).
    Malformed(String),
    /// An operation did not apply, or a `test` failed (the API server answers 422).
    Failed(String),
}

/// Applies a JSON Patch to `doc`: all of it, or (on an error) nothing.
pub(crate) fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let Value::Array(ops) = ops else {
        return Err(PatchError::Malformed(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".into(),
        ));
    };
    let mut work = doc.clone();
    for op in ops {
        apply_op(&mut work, op)?;
    }
    *doc = work;
    Ok(())
}

fn field<'a>(op: &'a Map<String, Value>, name: &str) -> Result<&'a str, PatchError> {
    match op.get(name) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(PatchError::Failed(format!(
            "operation missing {name} field"
        ))),
    }
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), PatchError> {
    let Value::Object(op) = op else {
        return Err(PatchError::Malformed(
            "a JSON Patch operation must be an object".into(),
        ));
    };
    let kind = field(op, "op")?;
    let path = pointer(field(op, "path")?)?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| PatchError::Failed(format!("{kind} operation missing value field")))
    };
    match kind {
        "add" => add(doc, &path, value()?),
        "remove" => remove(doc, &path).map(drop),
        "replace" => {
            let target = get_mut(doc, &path).ok_or_else(|| missing("replace", &path))?;
            *target = value()?;
            Ok(())
        }
        "move" => {
            let from = pointer(field(op, "from")?)?;
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(PatchError::Failed(
                    "move operation: from is a proper prefix of path".into(),
                ));
            }
            let moved = remove(doc, &from)?;
            add(doc, &path, moved)
        }
        "copy" => {
            let from = pointer(field(op, "from")?)?;
            let copied = get_mut(doc, &from)
                .ok_or_else(|| missing("copy", &from))?
                .clone();
            add(doc, &path, copied)
        }
        "test" => {
            let expected = op.get("value").unwrap_or(&Value::Null);
            let actual = get_mut(doc, &path).map(|v| &*v);
            let passes = match actual {
                // The API server's patch library treats a missing path as null.
                None | Some(Value::Null) => expected.is_null(),
                Some(actual) => actual == expected,
            };
            if passes {
                Ok(())
            } else {
                Err(PatchError::Failed(format!(
                    "testing value {} failed: test failed",
                    display(&path)
                )))
            }
        }
        other => Err(PatchError::Failed(format!("Unexpected kind: {other}"))),
    }
}

/// An RFC 6901 pointer's reference tokens, unescaped.
fn pointer(text: &str) -> Result<Vec<String>, PatchError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = text.strip_prefix('/') else {
        return Err(PatchError::Failed(format!(
            "invalid JSON pointer {text:?}: it must start with '/'"
        )));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn display(path: &[String]) -> String {
    path.iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn missing(op: &str, path: &[String]) -> PatchError {
    PatchError::Failed(format!(
        "{op} operation does not apply: doc is missing path: \"{}\"",
        display(path)
    ))
}

/// An array index token: digits only, no leading zero (RFC 6901).
fn index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

fn get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut here = doc;
    for token in path {
        here = match here {
            Value::Object(map) => map.get_mut(token)?,
            Value::Array(items) => items.get_mut(index(token)?)?,
            _ => return None,
        };
    }
    Some(here)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), PatchError> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match get_mut(doc, parent) {
        Some(Value::Object(map)) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(items)) => {
            let at = if last == "-" {
                items.len()
            } else {
                match index(last) {
                    Some(i) if i <= items.len() => i,
                    _ => {
                        return Err(PatchError::Failed(format!(
                            "add operation does not apply: index {last} out of bounds at {}",
                            display(path)
                        )));
                    }
                }
            };
            items.insert(at, value);
            Ok(())
        }
        _ => Err(missing("add", path)),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, PatchError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(PatchError::Failed(
            "remove operation: cannot remove the whole document".into(),
        ));
    };
    let removed = match get_mut(doc, parent) {
        Some(Value::Object(map)) => map.remove(last),
        Some(Value::Array(items)) => match index(last) {
            Some(i) if i < items.len() => Some(items.remove(i)),
            _ => None,
        },
        _ => None,
    };
    removed.ok_or_else(|| missing("remove", path))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{PatchError, json_patch};

    /// The JSON Patch operations themselves (RFC 6902), atomic.
    #[test]
    fn json_patch_operations_follow_rfc_6902() {
        let mut doc = json!({ "a": [1, 2], "b": { "c": "d" } });
        let ops = json!([
            { "op": "add", "path": "/a/-", "value": 3 },
            { "op": "add", "path": "/a/0", "value": 0 },
            { "op": "remove", "path": "/a/1" },
            { "op": "replace", "path": "/b/c", "value": "e" },
            { "op": "copy", "from": "/b", "path": "/f" },
            { "op": "move", "from": "/b/c", "path": "/g~1h" },
            { "op": "test", "path": "/a", "value": [0, 2, 3] },
            { "op": "test", "path": "/missing", "value": null },
        ]);
        json_patch(&mut doc, &ops).unwrap();
        assert_eq!(
            doc,
            json!({ "a": [0, 2, 3], "b": {}, "f": { "c": "e" }, "g/h": "e" })
        );
        let before = doc.clone();
        for bad in [
            json!([{ "op": "add", "path": "/a/-", "value": 4 }, { "op": "test", "path": "/a/0", "value": 9 }]),
            json!([{ "op": "remove", "path": "/b/c" }]),
            json!([{ "op": "replace", "path": "/a/5", "value": 1 }]),
            json!([{ "op": "add", "path": "/x/y", "value": 1 }]),
            json!([{ "op": "add", "path": "/a/01", "value": 1 }]),
            json!([{ "op": "add", "path": "/a/4", "value": 1 }]),
            json!([{ "op": "test", "path": "/a", "value": null }]),
            json!([{ "op": "move", "from": "/b", "path": "/b/c" }]),
            json!([{ "op": "frobnicate", "path": "/a" }]),
        ] {
            let result = json_patch(&mut doc, &bad);
            assert!(
                matches!(result, Err(PatchError::Failed(_))),
                "{bad}: {result:?}"
            );
            assert_eq!(doc, before, "{bad}");
        }
        let not_a_patch = json_patch(&mut doc, &json!({ "op": "add" }));
        assert!(matches!(not_a_patch, Err(PatchError::Malformed(_))));
    }
}
