package transport

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
)

// ReplicaIDHeader names the replica a request is meant for. A replica
// refuses a request that names another (RequireReplica).
//
// An address is not an identity: a restarted container or pod can come
// back at an address another replica had a moment ago, and a name lookup
// made meanwhile (or a connection kept from it) then reaches the wrong
// replica. Unchecked, a promoter would count one replica's Fence answer as
// two members' toward the quorum; seen in the compose chaos suite, where
// the promoter's connection for replica-3 reached replica-2 for over a
// minute after the replicas restarted together: replica-3 was never fenced
// for a range, and when replica-2 was paused no quorum could form. (etcd's
// peers check the target member's id on every request for the same reason.)
const ReplicaIDHeader = "Tenure-Replica-Id"

// ForReplica is the client option for calls meant for replica id: each
// request names it in ReplicaIDHeader.
func ForReplica(id string) connect.ClientOption {
	return connect.WithInterceptors(forReplica(id))
}

type forReplica string

func (id forReplica) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set(ReplicaIDHeader, string(id))
		return next(ctx, req)
	}
}

func (id forReplica) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set(ReplicaIDHeader, string(id))
		return conn
	}
}

func (forReplica) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// RequireReplica serves h for replica id, refusing a request that names
// another replica in ReplicaIDHeader with Unavailable before h sees it, so it
// changes nothing. Its connection is closed (HTTP/2 GOAWAY): every request
// on it reached the wrong replica, and the client's next attempt dials
// afresh, resolving the name again. Requests that name no replica (an
// operator's tenurectl, a gRPC tool) are served as before.
func RequireReplica(id string, h http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := r.Header.Get(ReplicaIDHeader)
		if want == "" || want == id {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		err := connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"misdirected: this is replica %s, the request is for replica %s (its address reached another replica; the connection is closed so the next attempt dials again)", id, want))
		_ = errs.Write(w, r, err)
	})
}
