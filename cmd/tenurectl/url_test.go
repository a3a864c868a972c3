package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// The message every URL flag refuses a non-address with (transport.BaseURL).
const badAddress = `"lease-1" is not a server address: want HOST:PORT, http://HOST:PORT or https://HOST:PORT`

// Every URL flag takes HOST:PORT (http:// here, where the cluster runs
// cleartext), and refuses a value that is no address with one message.
func testURLRule(t *testing.T, c *testCluster) {
	lease := strings.TrimPrefix(c.lease.Server.URL(), "http://")
	promoter := strings.TrimPrefix(c.promoterURL, "http://")
	var members []string
	for _, tr := range c.replicas {
		members = append(members, tr.id+"="+tr.listen)
	}
	run := func(vars map[string]string, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(k string) string { return vars[k] }}
		return run(context.Background(), e, args), out.String(), errOut.String()
	}
	for _, args := range [][]string{
		{"--lease", lease, "--promoter", promoter, "range", "create", "hostport", "--replicas", strings.Join(members, ",")},
		{"range", "list", "--lease", lease},
		{"--lease=" + lease, "status", "hostport"},
		{"transitions", "hostport", "--lease", lease, "--promoter", promoter},
	} {
		if code, stdout, stderr := run(nil, args...); code != exitOK {
			t.Errorf("tenurectl %s: status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	// The replicas' HOST:PORT became URLs in the membership.
	if out := c.mustCtl("", "range", "list"); !strings.Contains(out, "r1=http://"+c.byID["r1"].listen) {
		t.Errorf("range create --replicas ID=HOST:PORT did not store http:// URLs:\n%s", out)
	}

	for _, tt := range []struct {
		env  map[string]string
		args []string
		code int
	}{
		{nil, []string{"--lease", "lease-1", "status"}, exitUsage},
		{nil, []string{"status", "--lease", "lease-1"}, exitUsage},
		{nil, []string{"transitions", "r", "--promoter=lease-1"}, exitUsage},
		{nil, []string{"range", "create", "x", "--replicas", "r1=lease-1"}, exitUsage},
		{nil, []string{"range", "add-replica", "x", "r4=lease-1"}, exitUsage},
		{nil, []string{"trace", "--jaeger", "lease-1", "00000000000000000000000000000001"}, exitUsage},
		// From the environment too, in the same words.
		{map[string]string{"TENURECTL_LEASE": "lease-1"}, []string{"status"}, exitUsage},
		{map[string]string{"TENURECTL_JAEGER": "lease-1"}, []string{"trace", "00000000000000000000000000000001"}, exitUsage},
	} {
		code, _, stderr := run(tt.env, tt.args...)
		if code != tt.code || !strings.Contains(stderr, badAddress) {
			t.Errorf("tenurectl %s (env %v): status %d, stderr:\n%s\nwant status %d and %s", strings.Join(tt.args, " "), tt.env, code, stderr, tt.code, badAddress)
		}
	}
}
