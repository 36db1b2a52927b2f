/* sluice — server: whom a request may come from (origin.c). A web page
 * that a local user visits can send requests to the server on 127.0.0.1:
 * a form or a no-cors fetch (a "simple" cross-site request, which no CORS
 * rule stops), or, after DNS rebinding, a same-origin request under the
 * attacker's name. Three checks close both doors:
 *
 * - Host: the name the request was sent to must be one of the server's
 *   (loopback names and addresses, the bound address, --allowed-host): a
 *   rebinding page's requests carry its own name.
 * - Origin: when present it must be the server's own origin or one
 *   --cors-origin allows: a cross-site page's POSTs and fetches carry it.
 * - Content-Type: every POST must be application/json, which no form and
 *   no simple request can send (it needs a CORS preflight).
 *
 * Pure functions of the header values, no libmicrohttpd (http.c applies
 * them; test_server_origin and fuzz_origin call them directly). */
#ifndef SLUICE_SERVER_ORIGIN_H
#define SLUICE_SERVER_ORIGIN_H

#include <stdbool.h>
#include <stddef.h>

/* True when a Host header value (name or address, with an optional
 * ":port"; IPv6 in brackets) names this server:
 * - a loopback name or address: "localhost", any name under ".localhost"
 *   (RFC 6761: browsers resolve them to loopback only), 127.0.0.0/8, ::1;
 * - the bound address `bound` (--host), by name or by address; when it is
 *   a wildcard ("0.0.0.0", "::", ""), any IP address as well (DNS
 *   rebinding needs a name: a page at an address is that address's own);
 * - an entry of `allowed` (--allowed-host, comma-separated, NULL for
 *   none): a name or address (exact, case-insensitive), ".example.com"
 *   (that name and every name under it), or "*" (any host: the check is
 *   off).
 * Names compare case-insensitively, a trailing dot dropped. A malformed
 * value (empty, a bad port, a bare IPv6 address) is refused. */
bool sl__srv_host_allowed(const char *host, const char *bound,
                          const char *allowed);

/* True when an Origin header value may drive the server: the server's own
 * origin ("http://" or "https://" followed by the request's Host value,
 * `host`; NULL when the request has none), or one --cors-origin allows
 * (`cors`: "*" any, else a comma-separated list of exact origins; NULL or
 * "": none). "null" (a sandboxed frame, a file) is refused unless listed. */
bool sl__srv_origin_allowed(const char *origin, const char *host,
                            const char *cors);

/* True when a Content-Type header value is application/json (any case,
 * parameters such as "; charset=utf-8" allowed). NULL: false. */
bool sl__srv_content_type_json(const char *ct);

/* The listed-origin test alone: true when `origin` (its first n bytes) is
 * one of the comma- or space-separated entries of `list` (exact). */
bool sl__srv_origin_listed(const char *list, const char *origin, size_t n);

#endif
