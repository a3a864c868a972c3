package transport

import (
	"strings"
	"testing"
)

func TestBaseURL(t *testing.T) {
	for _, tt := range []struct {
		in        string
		tls       bool
		want      string
		wantError bool
	}{
		{in: "127.0.0.1:7000", want: "http://127.0.0.1:7000"},
		{in: "127.0.0.1:7000", tls: true, want: "https://127.0.0.1:7000"},
		{in: "lease-1:7000", tls: true, want: "https://lease-1:7000"},
		{in: "[::1]:7000", want: "http://[::1]:7000"},
		{in: "http://127.0.0.1:7000", want: "http://127.0.0.1:7000"},
		{in: "http://127.0.0.1:7000/", tls: true, want: "https://127.0.0.1:7000"},
		{in: "https://h:1", want: "https://h:1"},
		{in: "http://h:1/prefix", want: "http://h:1/prefix"},
		{in: "", wantError: true},
		{in: "lease-1", wantError: true},
		{in: "ftp://h:1", wantError: true},
		{in: "http://", wantError: true},
		{in: "h:1?x=y", wantError: true},
		{in: "http://user@h:1", wantError: true},
	} {
		got, err := BaseURL(tt.in, tt.tls)
		if (err != nil) != tt.wantError || got != tt.want {
			t.Errorf("BaseURL(%q, %v) = %q, %v; want %q, error %v", tt.in, tt.tls, got, err, tt.want, tt.wantError)
		}
	}
}

func TestBaseURLs(t *testing.T) {
	for _, tt := range []struct {
		in        string
		tls       bool
		want      string
		wantError bool
	}{
		{in: "lease-1:7000", want: "http://lease-1:7000"},
		{in: "https://lease-1:7000,https://lease-2:7000", want: "https://lease-1:7000 https://lease-2:7000"},
		{in: "lease-1:7000, lease-2:7000", tls: true, want: "https://lease-1:7000 https://lease-2:7000"},
		{in: "lease-1:7000,", wantError: true},
		{in: "lease-1:7000,lease-1:7000", wantError: true},
		{in: "lease-1:7000,http://lease-1:7000", wantError: true},
		{in: "a:1,a:2,a:3,a:4,a:5,a:6,a:7,a:8,a:9", wantError: true},
		{in: "", wantError: true},
	} {
		got, err := BaseURLs(tt.in, tt.tls)
		if (err != nil) != tt.wantError || strings.Join(got, " ") != tt.want {
			t.Errorf("BaseURLs(%q, %v) = %q, %v; want %q, error %v", tt.in, tt.tls, got, err, tt.want, tt.wantError)
		}
	}
}
