//! A call's arguments with every object's keys in its schema's order. llguidance's JSON
//! grammar writes an object's properties in the order the schema lists them, so arguments a
//! model wrote freely (before a lazy grammar bound, or in a shape the grammar did not force)
//! in another key order fail that grammar while being valid JSON Schema. Checking the
//! arguments put in schema order checks what the schema says, not the order.
//!
//! Invariant: the result holds exactly the input's keys and values; only the order of an
//! object's keys changes (listed keys first, in the schema's order; the rest after them, in
//! their own order).

use serde_json::{Map, Value};

/// How deep schemas and values are followed (a recursive `$ref` stops here; deeper values
/// keep their order).
const MAX_DEPTH: usize = 64;
/// How many `$ref`s in a row are followed before giving up on one.
const MAX_REFS: usize = 16;

/// `value` with each object's keys in the order of its schema: `properties` (and those of
/// `allOf` branches, in order; of the first `anyOf`/`oneOf` branch that lists every key),
/// following `items`, `prefixItems`, schema-valued `additionalProperties` and local `$ref`s
/// (`#/...`) against `schema` as the root.
pub(crate) fn in_schema_order(value: &Value, schema: &Value) -> Value {
    order(value, schema, schema, 0)
}

/// `schema` with its local `$ref`s followed.
fn resolve<'a>(mut schema: &'a Value, root: &'a Value) -> &'a Value {
    for _ in 0..MAX_REFS {
        let Some(target) = schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')).and_then(|p| root.pointer(p))
        else {
            break;
        };
        schema = target;
    }
    schema
}

/// The properties `schema` lists for an object with keys `keys`, in the order the grammar
/// writes them, each with its schema (the first listing wins).
fn listed<'a>(schema: &'a Value, root: &'a Value, keys: &Map<String, Value>, out: &mut Vec<(&'a str, &'a Value)>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let schema = resolve(schema, root);
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            if !out.iter().any(|(o, _)| o == k) {
                out.push((k.as_str(), s));
            }
        }
    }
    for branch in schema.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        listed(branch, root, keys, out, depth + 1);
    }
    for any in ["anyOf", "oneOf"] {
        let branches = schema.get(any).and_then(Value::as_array).into_iter().flatten();
        for branch in branches {
            let mut mine = Vec::new();
            listed(branch, root, keys, &mut mine, depth + 1);
            if keys.keys().all(|k| mine.iter().any(|(m, _)| m == k) || out.iter().any(|(o, _)| o == k)) {
                for p in mine {
                    if !out.iter().any(|(o, _)| *o == p.0) {
                        out.push(p);
                    }
                }
                break;
            }
        }
    }
}

fn order(value: &Value, schema: &Value, root: &Value, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return value.clone();
    }
    let schema = resolve(schema, root);
    match value {
        Value::Object(o) => {
            let mut props = Vec::new();
            listed(schema, root, o, &mut props, depth);
            let mut out = Map::new();
            for (k, s) in props {
                if let Some(v) = o.get(k) {
                    out.insert(k.to_string(), order(v, s, root, depth + 1));
                }
            }
            let extra = schema.get("additionalProperties").filter(|s| s.is_object());
            for (k, v) in o {
                if !out.contains_key(k) {
                    let v = match extra {
                        Some(s) => order(v, s, root, depth + 1),
                        None => v.clone(),
                    };
                    out.insert(k.clone(), v);
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => {
            let prefix = schema.get("prefixItems").and_then(Value::as_array);
            let items = schema.get("items").filter(|s| s.is_object());
            let each = a.iter().enumerate().map(|(i, v)| match prefix.and_then(|p| p.get(i)).or(items) {
                Some(s) => order(v, s, root, depth + 1),
                None => v.clone(),
            });
            Value::Array(each.collect())
        }
        v => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::in_schema_order;

    fn text(v: &serde_json::Value) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn keys_follow_the_schema_at_every_depth() {
        let schema = json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "when": {"$ref": "#/$defs/day"},
            "stops": {"type": "array", "items": {"type": "object", "properties": {"x": {}, "y": {}}}}},
            "$defs": {"day": {"type": "object", "properties": {"d": {}, "m": {}}}}});
        let args = json!({"stops": [{"y": 2, "x": 1}], "when": {"m": 3, "d": 9}, "city": "Oslo"});
        assert_eq!(text(&in_schema_order(&args, &schema)), r#"{"city":"Oslo","when":{"d":9,"m":3},"stops":[{"x":1,"y":2}]}"#);
    }

    #[test]
    fn unlisted_keys_keep_their_place_after_the_listed_ones_and_nothing_is_lost() {
        let schema = json!({"type": "object", "properties": {"a": {}, "b": {}}});
        let args = json!({"z": 0, "b": 2, "y": [1], "a": 1});
        let out = in_schema_order(&args, &schema);
        assert_eq!(text(&out), r#"{"a":1,"b":2,"z":0,"y":[1]}"#);
        assert_eq!(out, args, "same keys and values");
    }

    #[test]
    fn the_any_of_branch_that_lists_every_key_orders_them() {
        let schema = json!({"anyOf": [{"properties": {"r": {}}}, {"properties": {"w": {}, "h": {}}}]});
        assert_eq!(text(&in_schema_order(&json!({"h": 1, "w": 2}), &schema)), r#"{"w":2,"h":1}"#);
        let all = json!({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]});
        assert_eq!(text(&in_schema_order(&json!({"b": 1, "a": 2}), &all)), r#"{"a":2,"b":1}"#);
    }

    #[test]
    fn a_recursive_ref_ends() {
        let schema = json!({"$ref": "#", "properties": {"next": {"$ref": "#"}, "v": {}}});
        let mut v = json!({"v": 0});
        for i in 1..100 {
            v = json!({"v": i, "next": v});
        }
        assert_eq!(in_schema_order(&v, &schema), v);
    }
}
