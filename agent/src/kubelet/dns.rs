//! A pod's DNS configuration and its `/etc/resolv.conf` (kubelet's
//! `pkg/kubelet/network/dns`: `GetPodDNS`, `parseResolvConf`, `formDNSConfigFitsLimits`;
//! the file is written as containerd writes it from the resulting `DNSConfig`).

use k8s_openapi::api::core::v1::{Pod, PodDNSConfigOption};

/// kubelet's `validation.MaxDNSNameservers`.
const MAX_NAMESERVERS: usize = 3;
/// kubelet's `validation.MaxDNSSearchPaths`.
const MAX_SEARCH_PATHS: usize = 32;
/// kubelet's `validation.MaxDNSSearchListChars`.
const MAX_SEARCH_LIST_CHARS: usize = 2048;
/// `DNS1123SubdomainMaxLength`: longer search domains make some resolvers abort.
const MAX_SEARCH_DOMAIN_LEN: usize = 253;
/// kubelet's `defaultDNSOptions` for cluster DNS.
const DEFAULT_CLUSTER_OPTIONS: &str = "ndots:5";

/// kubelet's DNS settings: `--cluster-dns`, `--cluster-domain`, `--resolv-conf`.
#[derive(Debug, Clone, Default)]
pub struct DnsSettings {
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// The node's resolver file content; `None` when `--resolv-conf` is empty.
    pub host_resolv_conf: Option<String>,
    /// The node's IPs (the `Default` policy without a resolver file points at loopback).
    pub node_ips: Vec<String>,
}

/// The CRI `DNSConfig`: what `/etc/resolv.conf` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// A warning kubelet records as an event on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsWarning {
    pub reason: &'static str,
    pub message: String,
}

/// kubelet's `podDNSType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodDnsType {
    Cluster,
    Host,
    None,
}

fn pod_dns_type(pod: &Pod) -> PodDnsType {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    match spec.and_then(|s| s.dns_policy.as_deref()) {
        Some("None") => PodDnsType::None,
        Some("ClusterFirstWithHostNet") => PodDnsType::Cluster,
        Some("Default") => PodDnsType::Host,
        // ClusterFirst (the API default): host-network pods fall back to Default.
        _ if host_network => PodDnsType::Host,
        _ => PodDnsType::Cluster,
    }
}

/// kubelet's `parseResolvConf`: nameservers, search domains (the last `search` line wins,
/// trailing dots dropped, `.` skipped) and options (one per name, the last wins).
pub fn parse_resolv_conf(content: &str) -> DnsConfig {
    let mut out = DnsConfig::default();
    for line in content.lines() {
        if line.starts_with(['#', ';']) {
            continue;
        }
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => out.servers.extend(fields.next().map(str::to_owned)),
            Some("search") => {
                out.searches = fields
                    .filter(|s| *s != ".")
                    .map(|s| s.trim_end_matches('.').to_owned())
                    .collect();
            }
            Some("options") => {
                for option in fields {
                    set_option(&mut out.options, option.to_owned());
                }
            }
            _ => {}
        }
    }
    out
}

/// Sets `option` (`name` or `name:value`), replacing an option of the same name in place.
fn set_option(options: &mut Vec<String>, option: String) {
    let name = |o: &str| o.split(':').next().unwrap_or_default().to_owned();
    let wanted = name(&option);
    match options.iter_mut().find(|o| name(o) == wanted) {
        Some(existing) => *existing = option,
        None => options.push(option),
    }
}

fn omit_duplicates(items: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    items
        .into_iter()
        .filter(|item| seen.insert(item.clone()))
        .collect()
}

/// kubelet's `GetPodDNS`: the pod's resolver configuration and the warnings to record.
pub fn pod_dns(settings: &DnsSettings, pod: &Pod) -> (DnsConfig, Vec<DnsWarning>) {
    let mut warnings = Vec::new();
    let mut config = settings
        .host_resolv_conf
        .as_deref()
        .map(parse_resolv_conf)
        .unwrap_or_default();
    let mut dns_type = pod_dns_type(pod);
    if dns_type == PodDnsType::Cluster && settings.cluster_dns.is_empty() {
        let message = "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.";
        warnings.push(DnsWarning {
            reason: "MissingClusterDNS",
            message: format!("pod: {:?}. {message}", pod_name(pod)),
        });
        dns_type = PodDnsType::Host;
    }
    match dns_type {
        PodDnsType::None => config = DnsConfig::default(),
        PodDnsType::Cluster => {
            config.servers = settings.cluster_dns.clone();
            config.searches = cluster_searches(settings, pod, config.searches);
            config.options = vec![DEFAULT_CLUSTER_OPTIONS.to_owned()];
        }
        PodDnsType::Host if settings.host_resolv_conf.is_none() => {
            // No resolver file: the local resolver, which effectively disables lookups.
            config.servers = settings
                .node_ips
                .iter()
                .map(|ip| if ip.contains(':') { "::1" } else { "127.0.0.1" }.to_owned())
                .collect();
            if config.servers.is_empty() {
                config.servers.push("127.0.0.1".to_owned());
            }
            config.servers = omit_duplicates(config.servers);
            config.searches = vec![".".to_owned()];
        }
        PodDnsType::Host => {}
    }
    if let Some(pod_config) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        config
            .servers
            .extend(pod_config.nameservers.iter().flatten().cloned());
        config.servers = omit_duplicates(config.servers);
        config
            .searches
            .extend(pod_config.searches.iter().flatten().cloned());
        config.searches = omit_duplicates(config.searches);
        merge_options(&mut config.options, pod_config.options.iter().flatten());
    }
    fit_limits(&mut config, &mut warnings);
    (config, warnings)
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// kubelet's `generateSearchesForDNSClusterFirst`.
fn cluster_searches(settings: &DnsSettings, pod: &Pod, host: Vec<String>) -> Vec<String> {
    let domain = &settings.cluster_domain;
    if domain.is_empty() {
        return host;
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut searches = vec![
        format!("{namespace}.svc.{domain}"),
        format!("svc.{domain}"),
        domain.clone(),
    ];
    searches.extend(host);
    omit_duplicates(searches)
}

/// kubelet's `mergeDNSOptions`: the pod's options override the node's by name.
fn merge_options<'a>(
    options: &mut Vec<String>,
    pod_options: impl Iterator<Item = &'a PodDNSConfigOption>,
) {
    for option in pod_options {
        let Some(name) = option.name.as_deref() else {
            continue;
        };
        let value = option.value.as_deref().unwrap_or_default();
        let text = if value.is_empty() {
            name.to_owned()
        } else {
            format!("{name}:{value}")
        };
        set_option(options, text);
    }
}

/// kubelet's `formDNSConfigFitsLimits` and `formDNSSearchFitsLimits`.
fn fit_limits(config: &mut DnsConfig, warnings: &mut Vec<DnsWarning>) {
    if config.servers.len() > MAX_NAMESERVERS {
        config.servers.truncate(MAX_NAMESERVERS);
        warnings.push(DnsWarning {
            reason: "DNSConfigForming",
            message: format!("Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}", config.servers.join(" ")),
        });
    }
    let mut exceeded = false;
    if config.searches.len() > MAX_SEARCH_PATHS {
        config.searches.truncate(MAX_SEARCH_PATHS);
        exceeded = true;
    }
    let before = config.searches.len();
    config.searches.retain(|s| s.len() <= MAX_SEARCH_DOMAIN_LEN);
    exceeded |= config.searches.len() != before;
    let line_len = config.searches.join(" ").len();
    if line_len > MAX_SEARCH_LIST_CHARS {
        let mut cut = 0;
        while let Some(last) = config.searches.pop() {
            cut += last.len() + 1;
            if line_len - cut <= MAX_SEARCH_LIST_CHARS {
                break;
            }
        }
        exceeded = true;
    }
    if exceeded {
        warnings.push(DnsWarning {
            reason: "DNSConfigForming",
            message: format!("Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}", config.searches.join(" ")),
        });
    }
}

/// The `resolv.conf` content for `config` (containerd's layout: search, nameservers,
/// options).
pub fn resolv_conf_content(config: &DnsConfig) -> String {
    let mut out = String::new();
    if !config.searches.is_empty() {
        out.push_str(&format!("search {}\n", config.searches.join(" ")));
    }
    for server in &config.servers {
        out.push_str(&format!("nameserver {server}\n"));
    }
    if !config.options.is_empty() {
        out.push_str(&format!("options {}\n", config.options.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("test pod")
    }

    fn settings(cluster_dns: &[&str], host: Option<&str>) -> DnsSettings {
        DnsSettings {
            cluster_dns: cluster_dns.iter().map(|s| (*s).to_owned()).collect(),
            cluster_domain: "cluster.local".into(),
            host_resolv_conf: host.map(str::to_owned),
            node_ips: vec!["192.0.2.1".into()],
        }
    }

    const HOST: &str = "# comment\nnameserver 192.0.2.53\nsearch example.com. .\noptions ndots:2 rotate\noptions ndots:1\n";

    #[test]
    fn the_host_file_parses_as_kubelet_parses_it() {
        let parsed = parse_resolv_conf(HOST);
        assert_eq!(parsed.servers, ["192.0.2.53"]);
        assert_eq!(parsed.searches, ["example.com"]);
        assert_eq!(parsed.options, ["ndots:1", "rotate"]);
    }

    #[test]
    fn cluster_first_uses_cluster_dns_and_the_cluster_search_path() {
        let p = pod("metadata: {name: a, namespace: ns1}\nspec: {containers: []}");
        let (config, warnings) = pod_dns(&settings(&["10.0.0.10"], Some(HOST)), &p);
        assert!(warnings.is_empty());
        assert_eq!(
            resolv_conf_content(&config),
            "search ns1.svc.cluster.local svc.cluster.local cluster.local example.com\nnameserver 10.0.0.10\noptions ndots:5\n"
        );
    }

    #[test]
    fn cluster_first_without_cluster_dns_falls_back_to_default_with_a_warning() {
        let p = pod("metadata: {name: a}\nspec: {containers: []}");
        let (config, warnings) = pod_dns(&settings(&[], Some(HOST)), &p);
        assert_eq!(config, parse_resolv_conf(HOST));
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].reason, "MissingClusterDNS");
    }

    #[test]
    fn host_network_cluster_first_is_default_but_with_host_net_is_cluster() {
        let s = settings(&["10.0.0.10"], Some(HOST));
        let host = pod("metadata: {name: a}\nspec: {hostNetwork: true, containers: []}");
        assert_eq!(pod_dns(&s, &host).0.servers, ["192.0.2.53"]);
        let with = pod("metadata: {name: a}\nspec: {hostNetwork: true, dnsPolicy: ClusterFirstWithHostNet, containers: []}");
        assert_eq!(pod_dns(&s, &with).0.servers, ["10.0.0.10"]);
    }

    #[test]
    fn default_without_a_resolver_file_points_at_the_local_resolver() {
        let p = pod("metadata: {name: a}\nspec: {dnsPolicy: Default, containers: []}");
        let (config, _) = pod_dns(&settings(&[], None), &p);
        assert_eq!(
            resolv_conf_content(&config),
            "search .\nnameserver 127.0.0.1\n"
        );
    }

    #[test]
    fn none_takes_the_pods_dns_config_and_default_merges_options_by_name() {
        let s = settings(&["10.0.0.10"], Some(HOST));
        let none = pod(
            "metadata: {name: a}\nspec: {dnsPolicy: None, containers: [], dnsConfig: {nameservers: [1.2.3.4, 1.2.3.4], searches: [a.b], options: [{name: ndots, value: '3'}, {name: edns0}]}}",
        );
        assert_eq!(
            resolv_conf_content(&pod_dns(&s, &none).0),
            "search a.b\nnameserver 1.2.3.4\noptions ndots:3 edns0\n"
        );
        let default = pod(
            "metadata: {name: a}\nspec: {dnsPolicy: Default, containers: [], dnsConfig: {options: [{name: ndots, value: '4'}]}}",
        );
        assert_eq!(pod_dns(&s, &default).0.options, ["ndots:4", "rotate"]);
    }

    #[test]
    fn limits_cut_nameservers_and_search_domains_with_warnings() {
        let searches: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let long = "x".repeat(254);
        let yaml = format!(
            "metadata: {{name: a}}\nspec: {{dnsPolicy: None, containers: [], dnsConfig: {{nameservers: [1.1.1.1, 2.2.2.2, 3.3.3.3, 4.4.4.4], searches: [{long}, {}]}}}}",
            searches.join(", ")
        );
        let (config, warnings) = pod_dns(&settings(&[], None), &pod(&yaml));
        assert_eq!(config.servers.len(), MAX_NAMESERVERS);
        // The 254-character domain is first among the 32 kept, then dropped.
        assert_eq!(config.searches, searches[..31]);
        assert_eq!(warnings.len(), 2);

        let wide: Vec<String> = (0..32)
            .map(|i| format!("{i:02}{}", "y".repeat(98)))
            .collect();
        let yaml = format!(
            "metadata: {{name: a}}\nspec: {{dnsPolicy: None, containers: [], dnsConfig: {{searches: [{}]}}}}",
            wide.join(", ")
        );
        let (config, _) = pod_dns(&settings(&[], None), &pod(&yaml));
        assert!(config.searches.join(" ").len() <= MAX_SEARCH_LIST_CHARS);
        assert_eq!(config.searches, wide[..20]);
    }
}
