package transport

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// BaseURL is the one rule every flag that names a tenure server (or
// Jaeger) follows, in tenure and tenurectl alike: a URL with http:// or
// https://, or a bare HOST:PORT, which means the scheme the connection
// speaks (https with tls, http without). With tls an http:// URL means
// https:// too, so the cleartext defaults still name the right server. A
// value that is neither is refused with the same message everywhere.
func BaseURL(value string, tls bool) (string, error) {
	v := strings.TrimSpace(value)
	if !strings.Contains(v, "://") {
		if _, port, err := net.SplitHostPort(v); err == nil && port != "" {
			v = "http://" + v
		}
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q is not a server address: want HOST:PORT, http://HOST:PORT or https://HOST:PORT", value)
	}
	if tls && u.Scheme == "http" {
		u.Scheme = "https"
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// MaxBaseURLs bounds the instances one flag may name (BaseURLs): a client
// tries each in turn before a call fails, so the list bounds a call's tries.
const MaxBaseURLs = 8

// BaseURLs is BaseURL for a flag that may name several instances of one
// stateless service, separated by commas ("https://lease-1:7000,lease-2:7000"):
// each follows BaseURL's rule, none may be named twice, and there is at
// least one and at most MaxBaseURLs.
func BaseURLs(value string, tls bool) ([]string, error) {
	parts := strings.Split(value, ",")
	if len(parts) > MaxBaseURLs {
		return nil, fmt.Errorf("%q names %d servers, at most %d", value, len(parts), MaxBaseURLs)
	}
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		u, err := BaseURL(p, tls)
		if err != nil {
			return nil, err
		}
		for _, seen := range out {
			if seen == u {
				return nil, fmt.Errorf("%q names %s twice", value, u)
			}
		}
		out = append(out, u)
	}
	return out, nil
}
