//! `agenthost_origin` of any text (`check_origin`): never a panic; an accepted origin,
//! checked against a reading of its own (the URL parser and the standard library's
//! address classes), is
//! - a URL with a host, and without user, password, query, fragment or path;
//! - https, or http only to a loopback host and only where loopback is allowed;
//! - never a private, link-local, unspecified, broadcast, multicast or documentation
//!   address (an IPv4-mapped IPv6 address as its IPv4 address), nor loopback unless
//!   allowed;
//! - as a name, never one of the internal names (`*.internal`, `*.local`, a name
//!   without a dot, `metadata`), nor a loopback name unless allowed.
#![no_main]

use std::net::{Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use tollgate_api::forward::check_origin;

fn loopback_v4(ip: Ipv4Addr) -> bool {
    ip.is_loopback()
}

fn loopback_v6(ip: Ipv6Addr) -> bool {
    ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(loopback_v4)
}

fn check_v4(origin: &str, ip: Ipv4Addr, allow: bool) {
    assert!(
        !(ip.is_private()
            || ip.is_link_local()
            || ip.is_unspecified()
            || ip.is_broadcast()
            || ip.is_multicast()
            || ip.is_documentation()),
        "{origin:?} accepted: {ip}"
    );
    assert!(allow || !ip.is_loopback(), "{origin:?} accepted: {ip}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&flag, rest)) = data.split_first() else {
        return;
    };
    let Ok(origin) = std::str::from_utf8(rest) else {
        return;
    };
    let allow = flag & 1 == 1;
    if check_origin(origin, allow).is_err() {
        return;
    }
    let url = url::Url::parse(origin).expect("an accepted origin is a URL");
    assert!(
        url.username().is_empty() && url.password().is_none(),
        "{origin:?} accepted with credentials"
    );
    assert!(
        url.query().is_none() && url.fragment().is_none(),
        "{origin:?} accepted with a query or fragment"
    );
    assert!(
        matches!(url.path(), "" | "/"),
        "{origin:?} accepted with a path"
    );
    let host = url.host().expect("an accepted origin has a host");
    let loopback = match &host {
        url::Host::Ipv4(ip) => {
            check_v4(origin, *ip, allow);
            loopback_v4(*ip)
        }
        url::Host::Ipv6(ip) => {
            if let Some(v4) = ip.to_ipv4_mapped() {
                check_v4(origin, v4, allow);
            } else {
                let first = ip.segments()[0];
                assert!(
                    !(ip.is_unspecified()
                        || ip.is_multicast()
                        || (first & 0xfe00) == 0xfc00
                        || (first & 0xffc0) == 0xfe80),
                    "{origin:?} accepted: {ip}"
                );
                assert!(allow || !ip.is_loopback(), "{origin:?} accepted: {ip}");
            }
            loopback_v6(*ip)
        }
        url::Host::Domain(name) => {
            let bare = name.to_ascii_lowercase();
            let bare = bare.trim_end_matches('.');
            let loopback = bare == "localhost" || bare.ends_with(".localhost");
            assert!(allow || !loopback, "{origin:?} accepted: a loopback name");
            if !loopback {
                assert!(
                    bare.contains('.')
                        && !bare.ends_with(".internal")
                        && !bare.ends_with(".local")
                        && bare != "metadata"
                        && bare != "instance-data",
                    "{origin:?} accepted: an internal name"
                );
            }
            loopback
        }
    };
    match url.scheme() {
        "https" => {}
        "http" => assert!(allow && loopback, "{origin:?} accepted: http"),
        other => panic!("{origin:?} accepted with scheme {other}"),
    }
});
