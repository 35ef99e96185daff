//! Does a pod's placement fit this node: `spec.nodeSelector` and required node affinity
//! (`requiredDuringSchedulingIgnoredDuringExecution`) against the node's labels and name — the
//! scheduler's `GetRequiredNodeAffinity(pod).Match(node)`, as kubelet re-checks it.
//!
//! * every `nodeSelector` pair must equal a node label;
//! * when required node affinity is set, at least one of its terms must match; a term matches
//!   when all its `matchExpressions` hold on the labels and all its `matchFields` hold on the
//!   node's fields (only `metadata.name` exists); an empty term matches nothing;
//! * operators: `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt` (integers); an unknown
//!   operator or a malformed value never matches.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};

/// Whether `pod` may run on a node named `node_name` with `labels`.
#[must_use]
pub fn matches_node(pod: &Pod, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok = required.is_none_or(|selector| {
        selector
            .node_selector_terms
            .iter()
            .any(|term| term_matches(term, node_name, labels))
    });
    selector_ok && affinity_ok
}

fn term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let node_fields: BTreeMap<String, String> =
        [("metadata.name".to_owned(), node_name.to_owned())].into();
    expressions.iter().all(|r| requirement_holds(r, labels))
        && fields.iter().all(|r| requirement_holds(r, &node_fields))
}

fn requirement_holds(
    req: &NodeSelectorRequirement,
    values_by_key: &BTreeMap<String, String>,
) -> bool {
    let actual = values_by_key.get(&req.key);
    let values = req.values.as_deref().unwrap_or_default();
    let compare = |want: std::cmp::Ordering| match (actual, values) {
        (Some(actual), [bound]) => match (actual.parse::<i64>(), bound.parse::<i64>()) {
            (Ok(a), Ok(b)) => a.cmp(&b) == want,
            _ => false,
        },
        _ => false,
    };
    match req.operator.as_str() {
        "In" => actual.is_some_and(|a| values.contains(a)),
        "NotIn" => actual.is_none_or(|a| !values.contains(a)),
        "Exists" => actual.is_some(),
        "DoesNotExist" => actual.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> BTreeMap<String, String> {
        [("disk", "ssd"), ("zone", "a"), ("cores", "8")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn fits(spec: &str) -> bool {
        let pod: Pod = serde_yaml::from_str(&format!(
            "spec:\n  containers: [{{name: c, image: i}}]\n{spec}"
        ))
        .unwrap();
        matches_node(&pod, "node-1", &labels())
    }

    fn affinity(term: &str) -> String {
        format!("  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n{term}")
    }

    #[test]
    fn a_pod_without_constraints_fits() {
        assert!(fits(""));
    }

    #[test]
    fn every_node_selector_pair_must_match() {
        assert!(fits("  nodeSelector: {disk: ssd, zone: a}\n"));
        assert!(!fits("  nodeSelector: {disk: ssd, zone: b}\n"));
        assert!(!fits("  nodeSelector: {gpu: 'true'}\n"));
    }

    #[test]
    fn affinity_terms_are_ored_and_expressions_anded() {
        assert!(fits(&affinity("        - matchExpressions: [{key: zone, operator: In, values: [b]}]\n        - matchExpressions: [{key: zone, operator: In, values: [a, c]}, {key: disk, operator: Exists}]\n")));
        assert!(!fits(&affinity("        - matchExpressions: [{key: zone, operator: In, values: [a]}, {key: gpu, operator: Exists}]\n")));
    }

    #[test]
    fn every_operator_is_supported() {
        let holds = |expr: &str| {
            fits(&affinity(&format!(
                "        - matchExpressions: [{expr}]\n"
            )))
        };
        assert!(holds("{key: zone, operator: NotIn, values: [b]}"));
        assert!(holds("{key: gpu, operator: NotIn, values: [x]}"));
        assert!(holds("{key: gpu, operator: DoesNotExist}"));
        assert!(holds("{key: cores, operator: Gt, values: ['4']}"));
        assert!(holds("{key: cores, operator: Lt, values: ['16']}"));
        assert!(!holds("{key: cores, operator: Gt, values: ['8']}"));
        assert!(
            !holds("{key: zone, operator: Gt, values: ['1']}"),
            "not an integer"
        );
        assert!(!holds("{key: zone, operator: Near, values: [a]}"));
    }

    #[test]
    fn match_fields_compare_the_node_name_and_empty_terms_match_nothing() {
        assert!(fits(&affinity(
            "        - matchFields: [{key: metadata.name, operator: In, values: [node-1]}]\n"
        )));
        assert!(!fits(&affinity(
            "        - matchFields: [{key: metadata.name, operator: In, values: [node-2]}]\n"
        )));
        assert!(!fits(&affinity("        - {}\n")));
        assert!(!fits(&affinity("          []\n")));
    }
}
