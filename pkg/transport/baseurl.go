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
