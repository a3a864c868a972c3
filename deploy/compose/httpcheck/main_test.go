package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// --print prints the whole body, beyond the probe's 64 KiB, as make metrics
// needs for a replica's metrics; without it a probe prints the status line.
func TestPrintWritesTheBody(t *testing.T) {
	big := strings.Repeat("tenure_replica_ranges{role=\"leader\"} 1\n", 4096) // ~160 KiB
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, big) }))
	defer srv.Close()
	var out bytes.Buffer
	if err := check(&out, srv.URL, 5*time.Second, "", true); err != nil {
		t.Fatal(err)
	}
	if out.String() != big {
		t.Errorf("--print wrote %d bytes, want the body's %d", out.Len(), len(big))
	}
	out.Reset()
	if err := check(&out, srv.URL, 5*time.Second, "", false); err != nil {
		t.Fatal(err)
	}
	if want := srv.URL + ": 200 OK\n"; out.String() != want {
		t.Errorf("probe wrote %q, want %q", out.String(), want)
	}
}
