package promoter

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// authzClients are one identity's clients of the cluster's services.
type authzClients struct {
	replica  tenurev1connect.ReplicaServiceClient // the range's leader
	log      tenurev1connect.LogServiceClient     // the range's leader
	lease    tenurev1connect.LeaseServiceClient
	promoter tenurev1connect.PromoterServiceClient
}

// authzCall is one procedure, called with a request that would change the
// range if it were obeyed (each is what an attacker would send).
type authzCall struct {
	procedure string
	// mutates: an admitted caller would change the range; such calls are
	// only made by callers the table refuses.
	mutates bool
	call    func(ctx context.Context, c authzClients, epoch uint64) error
}

func streamErr[Req, Res any](s *connect.BidiStreamForClient[Req, Res], req *Req) error {
	if err := s.Send(req); err != nil {
		_, rerr := s.Receive()
		return rerr
	}
	_, err := s.Receive()
	_ = s.CloseRequest()
	_ = s.CloseResponse()
	return err
}

func serverStreamErr[Res any](s *connect.ServerStreamForClient[Res], err error) error {
	if err != nil {
		return err
	}
	defer s.Close()
	if s.Receive() {
		return nil
	}
	return s.Err()
}

func authzCalls(leaderID string) []authzCall {
	huge := ^uint64(0)
	members := []*tenurev1.Replica{{Id: "r1", Address: "http://127.0.0.1:1"}}
	return []authzCall{
		// LogService.
		{tenurev1connect.LogServiceAppendProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.log.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "r", Records: [][]byte{[]byte("intruder")}}))
			return err
		}},
		{tenurev1connect.LogServiceAppendStreamProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			return streamErr(c.log.AppendStream(ctx), &tenurev1.AppendStreamRequest{Append: &tenurev1.AppendRequest{RangeId: "r", Records: [][]byte{[]byte("intruder")}}})
		}},
		{tenurev1connect.LogServiceReadProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.log.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: "r"}))
			return err
		}},
		{tenurev1connect.LogServiceTailProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			return serverStreamErr(c.log.Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: "r"})))
		}},
		// ReplicaService, on the leader.
		{tenurev1connect.ReplicaServiceFetchProcedure, false, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.replica.Fetch(ctx, connect.NewRequest(&tenurev1.FetchRequest{RangeId: "r", Epoch: e, ReplicaId: "intruder", MaxWaitMs: 1}))
			return err
		}},
		{tenurev1connect.ReplicaServiceFetchStreamProcedure, false, func(ctx context.Context, c authzClients, e uint64) error {
			return streamErr(c.replica.FetchStream(ctx), &tenurev1.FetchStreamRequest{Fetch: &tenurev1.FetchRequest{RangeId: "r", Epoch: e, ReplicaId: "intruder", MaxWaitMs: 1}})
		}},
		{tenurev1connect.ReplicaServiceFetchSessionProcedure, false, func(ctx context.Context, c authzClients, e uint64) error {
			return streamErr(c.replica.FetchSession(ctx), &tenurev1.FetchSessionRequest{Pulls: []*tenurev1.SessionPull{{Id: 1, Fetch: &tenurev1.FetchRequest{RangeId: "r", Epoch: e, ReplicaId: "intruder"}}}})
		}},
		{tenurev1connect.ReplicaServiceFenceProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.replica.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "r", Epoch: huge}))
			return err
		}},
		{tenurev1connect.ReplicaServiceFenceRangesProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.replica.FenceRanges(ctx, connect.NewRequest(&tenurev1.FenceRangesRequest{Fences: []*tenurev1.FenceRequest{{RangeId: "r", Epoch: huge}}}))
			return err
		}},
		{tenurev1connect.ReplicaServiceTruncateProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.replica.Truncate(ctx, connect.NewRequest(&tenurev1.TruncateRequest{RangeId: "r", Epoch: e, TargetOffset: 0}))
			return err
		}},
		{tenurev1connect.ReplicaServiceAdoptProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.replica.Adopt(ctx, connect.NewRequest(&tenurev1.AdoptRequest{RangeId: "r", Epoch: e, Role: tenurev1.Role_ROLE_LEADER, LeaderId: leaderID,
				Replicas: []*tenurev1.Replica{{Id: leaderID, Address: "http://127.0.0.1:1"}}, CommittedBound: 1 << 30}))
			return err
		}},
		{tenurev1connect.ReplicaServiceAdoptRangesProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.replica.AdoptRanges(ctx, connect.NewRequest(&tenurev1.AdoptRangesRequest{Adopts: []*tenurev1.AdoptRequest{{RangeId: "r", Epoch: e,
				Role: tenurev1.Role_ROLE_FOLLOWER, LeaderId: "rogue", LeaderAddress: "http://127.0.0.1:1",
				Replicas: []*tenurev1.Replica{{Id: leaderID, Address: "http://127.0.0.1:1"}, {Id: "rogue", Address: "http://127.0.0.1:1"}}}}}))
			return err
		}},
		{tenurev1connect.ReplicaServiceDropRangeProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.replica.DropRange(ctx, connect.NewRequest(&tenurev1.DropRangeRequest{RangeId: "r", Epoch: e}))
			return err
		}},
		{tenurev1connect.ReplicaServiceGetStatusProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.replica.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
			return err
		}},
		{tenurev1connect.ReplicaServiceGetEpochHistoryProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.replica.GetEpochHistory(ctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: "r"}))
			return err
		}},
		// LeaseService.
		{tenurev1connect.LeaseServiceCreateRangeProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "intruder", Replicas: members}))
			return err
		}},
		{tenurev1connect.LeaseServiceSetRetentionProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			// One byte: obeyed, the leader would delete every committed record.
			_, err := c.lease.SetRetention(ctx, connect.NewRequest(&tenurev1.SetRetentionRequest{RangeId: "r", Retention: &tenurev1.RetentionPolicy{MaxBytes: 1}}))
			return err
		}},
		{tenurev1connect.LeaseServiceGetRangeProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "r"}))
			return err
		}},
		{tenurev1connect.LeaseServiceGetRangesProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.GetRanges(ctx, connect.NewRequest(&tenurev1.GetRangesRequest{RangeIds: []string{"r"}}))
			return err
		}},
		{tenurev1connect.LeaseServiceListRangesProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.ListRanges(ctx, connect.NewRequest(&tenurev1.ListRangesRequest{}))
			return err
		}},
		{tenurev1connect.LeaseServiceSetReplicasProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.SetReplicas(ctx, connect.NewRequest(&tenurev1.SetReplicasRequest{RangeId: "r", Replicas: members, ExpectedRevision: 1}))
			return err
		}},
		{tenurev1connect.LeaseServiceChangeMembershipProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.ChangeMembership(ctx, connect.NewRequest(&tenurev1.ChangeMembershipRequest{RangeId: "r", ExpectedRevision: 1,
				Step: tenurev1.MembershipStep_MEMBERSHIP_STEP_REMOVE, Replica: &tenurev1.Replica{Id: leaderID}}))
			return err
		}},
		{tenurev1connect.LeaseServiceCompleteMembershipChangeProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.CompleteMembershipChange(ctx, connect.NewRequest(&tenurev1.CompleteMembershipChangeRequest{RangeId: "r", ExpectedRevision: 1}))
			return err
		}},
		{tenurev1connect.LeaseServiceDeleteRangeProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.DeleteRange(ctx, connect.NewRequest(&tenurev1.DeleteRangeRequest{RangeId: "r"}))
			return err
		}},
		{tenurev1connect.LeaseServiceOpenSessionProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{HolderId: leaderID, TtlMs: 60_000}))
			return err
		}},
		{tenurev1connect.LeaseServiceKeepAliveProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.lease.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: 1, Held: []*tenurev1.RangeEpoch{{RangeId: "r", Epoch: e}}}))
			return err
		}},
		{tenurev1connect.LeaseServiceCloseSessionProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.CloseSession(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: 1}))
			return err
		}},
		{tenurev1connect.LeaseServiceGrantEpochProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.lease.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "r", PreviousEpoch: e, HolderId: "intruder"}))
			return err
		}},
		{tenurev1connect.LeaseServiceGrantEpochsProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.lease.GrantEpochs(ctx, connect.NewRequest(&tenurev1.GrantEpochsRequest{Grants: []*tenurev1.GrantEpochRequest{{RangeId: "r", PreviousEpoch: e, HolderId: "intruder"}}}))
			return err
		}},
		{tenurev1connect.LeaseServiceBindLeaseProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.lease.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "r", Epoch: e, HolderId: "intruder"}))
			return err
		}},
		{tenurev1connect.LeaseServiceBindLeasesProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.lease.BindLeases(ctx, connect.NewRequest(&tenurev1.BindLeasesRequest{Binds: []*tenurev1.BindLeaseRequest{{RangeId: "r", Epoch: e, HolderId: "intruder"}}}))
			return err
		}},
		{tenurev1connect.LeaseServiceReleaseLeaseProcedure, true, func(ctx context.Context, c authzClients, e uint64) error {
			_, err := c.lease.ReleaseLease(ctx, connect.NewRequest(&tenurev1.ReleaseLeaseRequest{RangeId: "r", Epoch: e, SessionId: 1}))
			return err
		}},
		{tenurev1connect.LeaseServiceGetLeaseProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.lease.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "r"}))
			return err
		}},
		{tenurev1connect.LeaseServiceWatchLeasesProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			err := serverStreamErr(c.lease.WatchLeases(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{RangeIds: []string{"r"}})))
			if connect.CodeOf(err) == connect.CodeDeadlineExceeded {
				return nil // admitted, and nothing happened to watch
			}
			return err
		}},
		// PromoterService.
		{tenurev1connect.PromoterServicePromoteProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.promoter.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", UnsafeAcceptDataLoss: true}))
			return err
		}},
		{tenurev1connect.PromoterServiceChangeReplicasProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			return serverStreamErr(c.promoter.ChangeReplicas(ctx, connect.NewRequest(&tenurev1.ChangeReplicasRequest{RangeId: "r", RemoveReplicaId: leaderID})))
		}},
		{tenurev1connect.PromoterServiceDeleteRangeProcedure, true, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.promoter.DeleteRange(ctx, connect.NewRequest(&tenurev1.PromoterServiceDeleteRangeRequest{RangeId: "r"}))
			return err
		}},
		{tenurev1connect.PromoterServiceListTransitionsProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.promoter.ListTransitions(ctx, connect.NewRequest(&tenurev1.ListTransitionsRequest{RangeId: "r"}))
			return err
		}},
		{tenurev1connect.PromoterServiceGetStatusProcedure, false, func(ctx context.Context, c authzClients, _ uint64) error {
			_, err := c.promoter.GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
			return err
		}},
	}
}

// rangeSnapshot is everything a refused call must leave as it was.
type rangeSnapshot struct {
	Replicas []*tenurev1.RangeStatus
	History  map[string][]journal.EpochStart
	Range    *tenurev1.RangeInfo
}

func (c *cluster) snapshot(t *testing.T, rangeID string) rangeSnapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := rangeSnapshot{History: map[string][]journal.EpochStart{}}
	for _, tr := range c.replicas {
		rc := c.replicaClient(tr.srv.URL())
		st, err := rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
		if err != nil {
			t.Fatalf("status of %s: %v", tr.id, err)
		}
		for _, rs := range st.Msg.GetRanges() {
			// What moves on its own in a healthy range: timings and the
			// lease's remaining TTL.
			rs = proto.Clone(rs).(*tenurev1.RangeStatus)
			for _, f := range rs.GetFollowers() {
				f.LastFetchUnixMs, f.FetchWaitingMs = 0, 0
			}
			s.Replicas = append(s.Replicas, rs)
		}
		h, err := rc.GetEpochHistory(ctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: rangeID}))
		if err != nil {
			t.Fatalf("history of %s: %v", tr.id, err)
		}
		s.History[tr.id] = journal.FromWire(h.Msg.GetHistory())
	}
	r, err := c.lease.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
	if err != nil {
		t.Fatal(err)
	}
	s.Range = proto.Clone(r.Msg.GetRange()).(*tenurev1.RangeInfo)
	if l := s.Range.GetLease(); l != nil {
		l.TtlRemainingMs = 0
	}
	return s
}

func (a rangeSnapshot) diff(b rangeSnapshot) string {
	if len(a.Replicas) != len(b.Replicas) {
		return fmt.Sprintf("replica ranges %d -> %d", len(a.Replicas), len(b.Replicas))
	}
	for i := range a.Replicas {
		if !proto.Equal(a.Replicas[i], b.Replicas[i]) {
			return fmt.Sprintf("replica status %v -> %v", a.Replicas[i], b.Replicas[i])
		}
	}
	for id, h := range a.History {
		if !slices.Equal(h, b.History[id]) {
			return fmt.Sprintf("%s history %v -> %v", id, h, b.History[id])
		}
	}
	if !proto.Equal(a.Range, b.Range) {
		return fmt.Sprintf("lease service range %v -> %v", a.Range, b.Range)
	}
	return ""
}

// testCerts makes a CA with a certificate per role (as-<role>) and one
// with every role (cluster) in dir, the same names under another CA in
// foreign, and load, which reads a certificate of either (trusting dir's CA).
func testCerts(t *testing.T) (dir, foreign string, load func(certDir, name string) *auth.Source) {
	t.Helper()
	dir, foreign = t.TempDir(), t.TempDir()
	specs := []auth.Spec{{Name: "cluster", Identity: auth.Identity{Roles: auth.Roles}}}
	for _, r := range auth.Roles {
		specs = append(specs, auth.Spec{Name: "as-" + string(r), Identity: auth.Identity{Roles: []auth.Role{r}}})
	}
	for _, d := range []string{dir, foreign} {
		if _, err := auth.Init(d, specs); err != nil {
			t.Fatal(err)
		}
	}
	load = func(certDir, name string) *auth.Source {
		src, err := auth.Load(auth.Files{Cert: filepath.Join(certDir, name+".pem"), Key: filepath.Join(certDir, name+"-key.pem"), CA: filepath.Join(dir, auth.CAFile)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	return dir, foreign, load
}

// tlsHTTPClient is an HTTP/2 client presenting cfg's certificate.
func tlsHTTPClient(cfg *tls.Config) *http.Client {
	var p http.Protocols
	p.SetHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: cfg}, Timeout: 10 * time.Second}
}

// TestEveryProcedureRefusesWhomTheTableRefuses calls every procedure of
// every service, over real mutual TLS on 127.0.0.1, as no certificate, a
// certificate of another CA, and each role, and checks the answer against
// auth.Table: Unauthenticated without a trusted certificate,
// PermissionDenied for a role the procedure does not admit, and in both
// cases the range exactly as it was (every replica's status and epoch
// history, and the lease service's epoch, lease and membership). Each call
// is what an attacker would send: Fence(R, 2^64-1), Truncate to 0, Adopt
// with a committed bound far beyond the log, a rogue leader, ...
func TestEveryProcedureRefusesWhomTheTableRefuses(t *testing.T) {
	dir, foreign, load := testCerts(t)
	// The cluster's own processes (in this test process) hold every role.
	transport.SetTLS(load(dir, "cluster"))
	t.Cleanup(func() { transport.SetTLS(nil) })

	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	psrv, err := transport.Serve("127.0.0.1:0", p.Handlers()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { psrv.Close() })
	leaderID, epoch := c.leader("r", 1, 20*time.Second)
	for i := range 3 {
		if _, err := c.appendOne("r", fmt.Sprint("before-", i), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	leaderURL := c.byID[leaderID].srv.URL()
	ctx := context.Background()
	clientsFor := func(cfg *tls.Config) authzClients {
		hc := tlsHTTPClient(cfg)
		opts := transport.ClientOptions()
		return authzClients{
			replica:  tenurev1connect.NewReplicaServiceClient(hc, leaderURL, opts...),
			log:      tenurev1connect.NewLogServiceClient(hc, leaderURL, opts...),
			lease:    tenurev1connect.NewLeaseServiceClient(hc, c.lease.Server.URL(), opts...),
			promoter: tenurev1connect.NewPromoterServiceClient(hc, psrv.URL(), opts...),
		}
	}
	// No certificate: trusts the CA, presents nothing.
	noCert := load(dir, "as-operator").ClientConfig()
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	callers := []struct {
		name  string
		cfg   *tls.Config
		roles []auth.Role // nil: no trusted certificate
	}{
		{"no certificate", noCert, nil},
		{"another CA's operator", load(foreign, "as-operator").ClientConfig(), nil},
	}
	for _, r := range auth.Roles {
		callers = append(callers, struct {
			name  string
			cfg   *tls.Config
			roles []auth.Role
		}{"role " + string(r), load(dir, "as-"+string(r)).ClientConfig(), []auth.Role{r}})
	}

	// Settle first: followers still catching up on the appends would move
	// their fetch offsets under the comparison, and the promoter records
	// the members' incarnations after the first promotion, in the
	// background (each a membership revision).
	waitFor(t, "every replica to hold and commit the whole log, and every incarnation recorded", 20*time.Second, func() bool {
		snap := c.snapshot(t, "r")
		if len(snap.Replicas) != len(c.replicas) {
			return false
		}
		for _, m := range snap.Range.GetReplicas() {
			if m.GetIncarnation() == "" {
				return false
			}
		}
		end := snap.Replicas[0].GetLogEnd()
		for _, rs := range snap.Replicas {
			if rs.GetLogEnd() != end || rs.GetHighWaterMark() != end {
				return false
			}
			for _, f := range rs.GetFollowers() {
				if f.GetFetchOffset() != end {
					return false
				}
			}
		}
		return true
	})
	before := c.snapshot(t, "r")
	calls := authzCalls(leaderID)
	if len(calls) != len(auth.Table) {
		t.Fatalf("the test calls %d procedures, auth.Table has %d: a procedure is not tested", len(calls), len(auth.Table))
	}
	refused, admitted := 0, 0
	for _, caller := range callers {
		cl := clientsFor(caller.cfg)
		for _, call := range calls {
			admits := auth.Table[call.procedure]
			ok := caller.roles != nil && slices.ContainsFunc(caller.roles, func(r auth.Role) bool { return slices.Contains(admits, r) })
			if ok && call.mutates {
				continue // admitted; the range's own tests cover what it does
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := call.call(cctx, cl, epoch)
			cancel()
			got := connect.CodeOf(err)
			switch {
			case caller.roles == nil:
				if got != connect.CodeUnauthenticated {
					t.Errorf("%s as %s = %v, want unauthenticated", call.procedure, caller.name, err)
				}
				refused++
			case !ok:
				if got != connect.CodePermissionDenied {
					t.Errorf("%s as %s = %v, want permission denied", call.procedure, caller.name, err)
				}
				refused++
			default:
				if err != nil && (got == connect.CodeUnauthenticated || got == connect.CodePermissionDenied) {
					t.Errorf("%s as %s, which the table admits = %v", call.procedure, caller.name, err)
				}
				admitted++
			}
		}
	}
	if d := before.diff(c.snapshot(t, "r")); d != "" {
		t.Fatalf("after %d refused and %d admitted read-only calls the range changed: %s", refused, admitted, d)
	}
	t.Logf("%d calls refused, %d read-only calls admitted; the range is unchanged", refused, admitted)
}
