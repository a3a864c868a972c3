package auth_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tenurelog/tenure/pkg/auth"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Every procedure of every tenure service is in the table: a new RPC is
// closed to everyone until the table says who may call it, and this test
// says so when one is added.
func TestTableCoversEveryProcedure(t *testing.T) {
	files := []protoreflect.FileDescriptor{
		tenurev1.File_tenure_v1_lease_proto, tenurev1.File_tenure_v1_log_proto,
		tenurev1.File_tenure_v1_promoter_proto, tenurev1.File_tenure_v1_replica_proto,
	}
	n := 0
	for _, f := range files {
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			for j := range svc.Methods().Len() {
				p := "/" + string(svc.FullName()) + "/" + string(svc.Methods().Get(j).Name())
				n++
				if roles, ok := auth.Table[p]; !ok || len(roles) == 0 {
					t.Errorf("procedure %s has no roles in auth.Table", p)
				}
			}
		}
	}
	if n != len(auth.Table) {
		t.Errorf("auth.Table has %d procedures, the services %d: it names one that does not exist", len(auth.Table), n)
	}
}

func TestDecide(t *testing.T) {
	promoter := auth.Identity{Name: "promoter-1", Roles: []auth.Role{auth.RolePromoter}}
	producer := auth.Identity{Name: "producer", Roles: []auth.Role{auth.RoleProducer}}
	for _, tc := range []struct {
		procedure string
		id        auth.Identity
		ok        bool
		want      connect.Code // 0 = admitted
	}{
		{tenurev1connect.ReplicaServiceFenceProcedure, auth.Identity{}, false, connect.CodeUnauthenticated},
		{tenurev1connect.ReplicaServiceFenceProcedure, producer, true, connect.CodePermissionDenied},
		{tenurev1connect.ReplicaServiceFenceProcedure, promoter, true, 0},
		{tenurev1connect.LogServiceAppendProcedure, producer, true, 0},
		{tenurev1connect.LogServiceAppendProcedure, promoter, true, connect.CodePermissionDenied},
		// A producer and a consumer find the range's leader in the lease
		// service and the replicas' status (tenurectl produce and consume
		// do), and read nothing else in the lease service.
		{tenurev1connect.LeaseServiceGetRangeProcedure, producer, true, 0},
		{tenurev1connect.LeaseServiceGetRangeProcedure, auth.Identity{Name: "consumer", Roles: []auth.Role{auth.RoleConsumer}}, true, 0},
		{tenurev1connect.ReplicaServiceGetStatusProcedure, producer, true, 0},
		{tenurev1connect.ReplicaServiceGetStatusProcedure, auth.Identity{Name: "consumer", Roles: []auth.Role{auth.RoleConsumer}}, true, 0},
		// The same question batched or narrowed; enumerating or watching
		// every range is not theirs.
		{tenurev1connect.LeaseServiceGetRangesProcedure, producer, true, 0},
		{tenurev1connect.LeaseServiceGetLeaseProcedure, auth.Identity{Name: "consumer", Roles: []auth.Role{auth.RoleConsumer}}, true, 0},
		{tenurev1connect.LeaseServiceWatchLeasesProcedure, producer, true, connect.CodePermissionDenied},
		{tenurev1connect.LeaseServiceListRangesProcedure, producer, true, connect.CodePermissionDenied},
		{tenurev1connect.LeaseServiceCreateRangeProcedure, producer, true, connect.CodePermissionDenied},
		{"/grpc.health.v1.Health/Check", auth.Identity{}, false, 0},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", promoter, true, connect.CodePermissionDenied},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", auth.Identity{Roles: []auth.Role{auth.RoleOperator}}, true, 0},
		{"/tenure.v1.ReplicaService/Unknown", promoter, true, connect.CodePermissionDenied},
	} {
		err := auth.Decide(tc.procedure, tc.id, tc.ok)
		var got connect.Code
		if err != nil {
			got = err.Code()
		}
		if got != tc.want {
			t.Errorf("Decide(%s, %v, %v) = %v, want code %v", tc.procedure, tc.id, tc.ok, err, tc.want)
		}
	}
}

// initCerts makes a cluster's certificates in a temp dir.
func initCerts(t *testing.T, dir string) {
	t.Helper()
	if _, err := auth.Init(dir, auth.DefaultSpecs([]string{"r1"}, []string{"p1"}, []string{"1"}, nil)); err != nil {
		t.Fatalf("Init = %v", err)
	}
}

func files(dir, name string) auth.Files {
	return auth.Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, auth.CAFile)}
}

func TestInitIsIdempotent(t *testing.T) {
	dir := t.TempDir()
	first, err := auth.Init(dir, auth.DefaultSpecs([]string{"r1", "r2"}, []string{"p1"}, nil, []string{"replica-1"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 1+2+1+3 {
		t.Fatalf("Init wrote %v, want the CA and 6 certificates", first)
	}
	again, err := auth.Init(dir, auth.DefaultSpecs([]string{"r1", "r2", "r3"}, []string{"p1"}, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 1 || again[0] != "replica-r3" {
		t.Fatalf("second Init wrote %v, want only the new replica-r3", again)
	}
	fi, err := os.Stat(filepath.Join(dir, "replica-r1-key.pem"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode = %v, %v; want 0600", fi.Mode(), err)
	}
}

// serve runs a real HTTP/2 TLS server on 127.0.0.1 with the promoter
// service's Unimplemented handler behind auth.Handler: a call the table
// admits answers Unimplemented, a refused one its refusal.
func serve(t *testing.T, src *auth.Source) string {
	t.Helper()
	path, h := tenurev1connect.NewPromoterServiceHandler(tenurev1connect.UnimplementedPromoterServiceHandler{})
	mux := http.NewServeMux()
	mux.Handle(path, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP2(true)
	srv := &http.Server{Handler: auth.Handler(mux, src, nil), Protocols: &p}
	go srv.Serve(tls.NewListener(ln, src.ServerConfig()))
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

func client(src *auth.Source, url string) tenurev1connect.PromoterServiceClient {
	var p http.Protocols
	p.SetHTTP2(true)
	var cfg *tls.Config
	if src != nil {
		cfg = src.ClientConfig()
	} else {
		cfg = &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}} // no client certificate
	}
	hc := &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	return tenurev1connect.NewPromoterServiceClient(hc, url)
}

func code(err error) connect.Code {
	if err == nil {
		return 0
	}
	return connect.CodeOf(err)
}

func TestHandlerOverRealTLS(t *testing.T) {
	dir := t.TempDir()
	initCerts(t, dir)
	server, err := auth.Load(files(dir, "lease-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, server)
	ctx := context.Background()
	promote := func(c tenurev1connect.PromoterServiceClient) error {
		_, err := c.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r"}))
		return err
	}
	for _, name := range []string{"operator", "promoter-p1", "producer"} {
		src, err := auth.Load(files(dir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		want := connect.CodePermissionDenied
		if name == "operator" || name == "promoter-p1" {
			// Admitted: the handler answered. A promoter forwards an
			// operator's Promote to the elected one (table.go).
			want = connect.CodeUnimplemented
		}
		if got := code(promote(client(src, url))); got != want {
			t.Errorf("Promote as %s = %v, want %v", name, got, want)
		}
	}
	if got := code(promote(client(nil, url))); got != connect.CodeUnauthenticated {
		t.Errorf("Promote without a certificate = %v, want unauthenticated", got)
	}
	// An operator certificate from another CA, by a client that trusts
	// this cluster's CA: the server answers, Unauthenticated.
	other := t.TempDir()
	initCerts(t, other)
	foreign, err := auth.Load(auth.Files{Cert: files(other, "operator").Cert, Key: files(other, "operator").Key, CA: files(dir, "operator").CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := code(promote(client(foreign, url))); got != connect.CodeUnauthenticated {
		t.Errorf("Promote with another CA's operator certificate = %v, want unauthenticated", got)
	}
}

// A certificate replaced on disk is served without a restart.
func TestSourceReloads(t *testing.T) {
	dir := t.TempDir()
	initCerts(t, dir)
	server, err := auth.Load(files(dir, "lease-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, server)
	// A whole new CA and certificates, written over the old files: the
	// old operator certificate no longer verifies, a new one does.
	old, err := auth.Load(files(dir, "operator"), nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh := t.TempDir()
	initCerts(t, fresh)
	for _, f := range []string{"ca.pem", "ca-key.pem", "lease-1.pem", "lease-1-key.pem"} {
		b, err := os.ReadFile(filepath.Join(fresh, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	neu, err := auth.Load(files(fresh, "operator"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, errNew := client(neu, url).GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		_, errOld := client(old, url).GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		if code(errNew) == connect.CodeUnimplemented && errOld != nil && code(errOld) != connect.CodeUnimplemented {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the files changed: new certificate %v, old %v; want the new one admitted and the old refused", errNew, errOld)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestLoadRefusesHalfASetup(t *testing.T) {
	dir := t.TempDir()
	initCerts(t, dir)
	f := files(dir, "operator")
	f.CA = ""
	if _, err := auth.Load(f, nil); err == nil {
		t.Fatal("Load without a CA = nil error")
	}
	f = files(dir, "operator")
	f.Key = files(dir, "producer").Key
	if _, err := auth.Load(f, nil); err == nil {
		t.Fatal("Load of a certificate with another's key = nil error")
	}
	if _, err := auth.Load(files(dir, "missing"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load of missing files = %v, want not exist", err)
	}
}
