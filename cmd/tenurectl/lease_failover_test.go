package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// Issue 27: tenurectl given two lease service instances, the first dead,
// answers through the second: status names the leader, range list the
// range. Before, a --lease naming two URLs was refused as not a server
// address.
func TestStatusWithFirstLeaseInstanceDead(t *testing.T) {
	c := newTestCluster(t)
	leader := c.createRange("lf", "r1")
	// Another instance on the same etcd, dead: its port refuses.
	dead := leasetest.StartOn(t, c.lease.Etcd)
	dead.Server.Close()
	dead.Service.Close()
	both := dead.Server.URL() + "," + c.lease.Server.URL()

	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"flag", []string{"--lease", both, "--promoter", c.promoterURL, "--json", "status", "lf"}, nil},
		{"env", []string{"--promoter", c.promoterURL, "--json", "status", "lf"}, map[string]string{"TENURECTL_LEASE": both}},
	} {
		var out, errOut bytes.Buffer
		e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(k string) string { return tt.env[k] }}
		if code := run(context.Background(), e, tt.args); code != exitOK {
			t.Fatalf("%s: tenurectl %s: status %d\nstdout:\n%s\nstderr:\n%s", tt.name, strings.Join(tt.args, " "), code, out.String(), errOut.String())
		}
		var st []statusJSON
		if err := json.Unmarshal(out.Bytes(), &st); err != nil || len(st) != 1 || st[0].Leader != leader {
			t.Errorf("%s: status --json = %s (%v); want range lf led by %s", tt.name, out.String(), err, leader)
		}
	}

	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	if code := run(context.Background(), e, []string{"range", "list", "--lease", both}); code != exitOK || !strings.Contains(out.String(), "lf") {
		t.Errorf("range list --lease %s: status %d\nstdout:\n%s\nstderr:\n%s", both, code, out.String(), errOut.String())
	}
}
