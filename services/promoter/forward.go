package promoter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// A standby promoter forwards an operator's request (Promote,
// ChangeReplicas, DeleteRange, GetStatus) to the elected one, so that an
// operator need not know which is elected: compose's `make ctl` names
// promoter-1, and when promoter-2 won the election every promote was
// refused and every status ended in "promoter-1 is a standby".
//
// The forward is the standby's own call: its own client certificate (the
// elected promoter admits the promoter role for these procedures;
// pkg/auth's table), after the standby's server admitted the operator's
// certificate for the procedure. It carries the caller's context: its
// deadline and trace.

// ForwardedHeader marks a request a promoter forwarded, naming the
// forwarder. A request carrying it is never forwarded again: forwarding is
// one hop, so two promoters that each see the other as elected (the
// election changing hands) cannot pass a request back and forth; the
// second answers that it is not elected.
const ForwardedHeader = "Tenure-Forwarded-By"

// candidate is a promoter's election value: its id and where it is reached.
type candidate struct {
	ID  string `json:"id"`
	URL string `json:"url,omitempty"`
}

// candidateValue is the election value of promoter id at url: the bare id
// without a URL, as promoters published before they forwarded.
func candidateValue(id, url string) string {
	if url == "" {
		return id
	}
	b, _ := json.Marshal(candidate{ID: id, URL: url})
	return string(b)
}

// parseCandidate reads an election value; a bare id has no URL.
func parseCandidate(v []byte) (id, url string) {
	var c candidate
	if len(v) > 0 && v[0] == '{' && json.Unmarshal(v, &c) == nil && c.ID != "" {
		return c.ID, c.URL
	}
	return string(v), ""
}

// forwardTarget returns the elected promoter to forward a request with
// headers h to, or ok=false when this promoter answers it itself: it is
// elected, the request was forwarded already, or the elected one is
// unknown or published no URL (then the request is refused naming it).
func (p *Promoter) forwardTarget(h http.Header) (c tenurev1connect.PromoterServiceClient, id string, ok bool) {
	if h.Get(ForwardedHeader) != "" {
		return nil, "", false
	}
	p.mu.Lock()
	elected, id, url := p.elected, p.leaderID, p.leaderURL
	p.mu.Unlock()
	if elected || id == "" || id == p.cfg.ID || url == "" {
		return nil, "", false
	}
	p.forwardMu.Lock()
	defer p.forwardMu.Unlock()
	if c = p.forwards[url]; c == nil {
		if p.forwards == nil {
			p.forwards = map[string]tenurev1connect.PromoterServiceClient{}
		}
		c = tenurev1connect.NewPromoterServiceClient(p.cfg.HTTPClient, url, transport.ClientOptions()...)
		p.forwards[url] = c
	}
	return c, id, true
}

// forwardRequest is msg as a request this promoter forwards.
func forwardRequest[T any](p *Promoter, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(ForwardedHeader, p.cfg.ID)
	return req
}

// forwardedErr is the elected promoter's error (or the failure to reach
// it) as this promoter answers it: the same code and details, the message
// saying where it came from.
func (p *Promoter) forwardedErr(err error, to string) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("promoter %s forwarded to the elected promoter %s: %w", p.cfg.ID, to, err))
	}
	out := connect.NewError(ce.Code(), fmt.Errorf("promoter %s forwarded to the elected promoter %s: %s", p.cfg.ID, to, ce.Message()))
	for _, d := range ce.Details() {
		out.AddDetail(d)
	}
	return out
}

func (p *Promoter) forwardPromote(ctx context.Context, c tenurev1connect.PromoterServiceClient, to string, msg *tenurev1.PromoteRequest) (*connect.Response[tenurev1.PromoteResponse], error) {
	resp, err := c.Promote(ctx, forwardRequest(p, msg))
	if err != nil {
		return nil, p.forwardedErr(err, to)
	}
	return connect.NewResponse(resp.Msg), nil
}

func (p *Promoter) forwardDeleteRange(ctx context.Context, c tenurev1connect.PromoterServiceClient, to string, msg *tenurev1.PromoterServiceDeleteRangeRequest) (*connect.Response[tenurev1.PromoterServiceDeleteRangeResponse], error) {
	resp, err := c.DeleteRange(ctx, forwardRequest(p, msg))
	if err != nil {
		return nil, p.forwardedErr(err, to)
	}
	return connect.NewResponse(resp.Msg), nil
}

func (p *Promoter) forwardGetStatus(ctx context.Context, c tenurev1connect.PromoterServiceClient, to string, msg *tenurev1.PromoterServiceGetStatusRequest) (*connect.Response[tenurev1.PromoterServiceGetStatusResponse], error) {
	resp, err := c.GetStatus(ctx, forwardRequest(p, msg))
	if err != nil {
		return nil, p.forwardedErr(err, to)
	}
	return connect.NewResponse(resp.Msg), nil
}

// forwardChangeReplicas relays the elected promoter's phases as they come.
func (p *Promoter) forwardChangeReplicas(ctx context.Context, c tenurev1connect.PromoterServiceClient, to string, msg *tenurev1.ChangeReplicasRequest, send func(*tenurev1.ChangeReplicasResponse) error) error {
	stream, err := c.ChangeReplicas(ctx, forwardRequest(p, msg))
	if err != nil {
		return p.forwardedErr(err, to)
	}
	defer stream.Close()
	for stream.Receive() {
		if err := send(stream.Msg()); err != nil {
			return err
		}
	}
	return p.forwardedErr(transport.LostStream(stream.Err()), to)
}
