package main

import (
	"context"
	"net"
	"testing"

	"github.com/tenurelog/tenure/pkg/transport"
)

func TestHealthServing(t *testing.T) {
	srv, err := transport.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := runHealth(context.Background(), []string{"--url", srv.URL()}); err != nil {
		t.Fatalf("health of a serving server: %v", err)
	}
}

func TestHealthUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := runHealth(context.Background(), []string{"--url", "http://" + addr, "--timeout", "1s"}); err == nil {
		t.Fatal("health of a closed port succeeded")
	}
}

func TestHealthUnknownService(t *testing.T) {
	srv, err := transport.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := runHealth(context.Background(), []string{"--url", srv.URL(), "--service", "no.such.Service"}); err == nil {
		t.Fatal("health of an unknown service succeeded")
	}
}

// --url takes HOST:PORT like every URL flag of tenure and tenurectl, and
// refuses what is not a server address with the same message.
func TestHealthURLRule(t *testing.T) {
	srv, err := transport.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := runHealth(context.Background(), []string{"--url", srv.Addr}); err != nil {
		t.Errorf("health --url %s (HOST:PORT): %v", srv.Addr, err)
	}
	err = runHealth(context.Background(), []string{"--url", "lease-1"})
	if want := `--url: "lease-1" is not a server address: want HOST:PORT, http://HOST:PORT or https://HOST:PORT`; err == nil || err.Error() != want {
		t.Errorf("health --url lease-1: %v, want %s", err, want)
	}
}
