package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
)

// Failover is a connect.HTTPClient that sends each call to one of several
// instances of a stateless service (the lease service: every instance
// serves the same etcd), and moves to the next instance when one does not
// answer. Build the Connect client with Failover.BaseURL() as its base URL;
// Failover sends each call to the instance that answered last, and on
// failure to the others in order, at most once each.
//
// Whether a call may go to another instance depends on what the first one
// may have done with it:
//
//   - The request never left this process (the dial failed: connection
//     refused, the name does not resolve, the dial timed out). No instance
//     saw it, so any call, whatever it does, is sent to the next one.
//   - The outcome is unknown (the connection broke after the request was
//     sent, the instance was too slow, or it answered Unavailable, which
//     the lease service says when etcd did not answer it in time: the
//     write may still apply). Only a call that Retry says is safe to
//     repeat goes to the next instance; any other returns this error to
//     its caller, who knows what an unknown outcome means for it.
//
// Every call is bounded by its context as before. A safe call on an
// instance that is not the last one left gets an equal share of what
// remains of its deadline (a frozen instance would otherwise spend all of
// it), so the other instances still get their turn.
type Failover struct {
	hc    connect.HTTPClient
	bases []*url.URL
	// safe says whether a call to procedure (a Connect procedure path,
	// "/tenure.v1.LeaseService/KeepAlive") whose outcome is unknown may
	// be sent again to another instance.
	safe func(procedure string) bool
	// current is the index in bases of the instance that answered last:
	// the first one every call tries.
	current atomic.Int32
}

// NewFailover returns a Failover over hc to the instances at bases
// (BaseURLs, at least one). safe says which procedures may be sent again
// after an unknown outcome (nil: none).
func NewFailover(hc connect.HTTPClient, bases []string, safe func(procedure string) bool) (*Failover, error) {
	if len(bases) == 0 || len(bases) > MaxBaseURLs {
		return nil, fmt.Errorf("transport: failover over %d servers: want 1 to %d", len(bases), MaxBaseURLs)
	}
	if safe == nil {
		safe = func(string) bool { return false }
	}
	f := &Failover{hc: hc, safe: safe}
	for _, b := range bases {
		u, err := url.Parse(b)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("transport: failover: %q is not a base URL", b)
		}
		f.bases = append(f.bases, u)
	}
	return f, nil
}

// BaseURL is the base URL to build the Connect client with: the first
// instance's. Do sends each call to whichever instance it picks.
func (f *Failover) BaseURL() string { return f.bases[0].String() }

// Current is the base URL of the instance calls go to first now: the one
// that answered last.
func (f *Failover) Current() string { return f.bases[f.current.Load()].String() }

// Do sends req to the current instance and, as the rules on Failover say,
// to the others.
func (f *Failover) Do(req *http.Request) (*http.Response, error) {
	n := len(f.bases)
	if n == 1 {
		return f.hc.Do(req)
	}
	// The procedure, as the Connect client appended it to the base URL.
	procedure := strings.TrimPrefix(req.URL.Path, strings.TrimRight(f.bases[0].Path, "/"))
	safe := f.safe(procedure)
	start := int(f.current.Load())
	var lastErr error
	// tried holds every instance's failure, for the error that reports
	// them all: the last one alone hid why the others failed (a TLS
	// mismatch on the first behind "connection refused" on the second).
	tried := make([]error, 0, n)
	for i := range n {
		idx := (start + i) % n
		last := i == n-1
		attempt := req
		if i > 0 || idx != 0 {
			attempt = f.retarget(req, idx)
		}
		if i > 0 {
			// The body of the first try may be consumed: a fresh copy.
			if req.GetBody == nil {
				return nil, lastErr // cannot be sent again (a client stream)
			}
			body, err := req.GetBody()
			if err != nil {
				return nil, lastErr
			}
			attempt.Body = body
		}
		var sh *share
		if safe && !last {
			attempt, sh = withShare(attempt, n-i)
		}
		resp, err := f.hc.Do(attempt)
		expired := sh.end(resp, err)
		switch {
		case err == nil && !expired && !(safe && !last && resp.StatusCode == http.StatusServiceUnavailable):
			// An answer (an error answer too, but for a safe call's
			// Unavailable): this instance works. One that answers
			// Unavailable (it cannot reach etcd in time) answers this
			// call, whose outcome is unknown, but later calls try the
			// next instance first. So does one that answers
			// deadline_exceeded (HTTP 504 in Connect): the caller's
			// deadline, which Connect sends along, ran out on the server
			// first, and the call spent it there, as a caller's own
			// deadline spent waiting would (below). Which of the two
			// fires first is a race, decided by load.
			if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGatewayTimeout {
				f.current.CompareAndSwap(int32(idx), int32((idx+1)%n))
			} else {
				f.current.Store(int32(idx))
			}
			return resp, nil
		case req.Context().Err() != nil:
			// The caller's deadline or cancellation: nothing is left to
			// try with. A deadline spent waiting on this instance moves
			// later calls on to the next one; a caller that gave up says
			// nothing about the instance.
			if errors.Is(req.Context().Err(), context.DeadlineExceeded) {
				f.current.CompareAndSwap(int32(idx), int32((idx+1)%n))
			}
			return resp, err
		}
		if err == nil {
			// Unavailable (or the share ran out as the answer came): the
			// next instance is asked instead.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			err = fmt.Errorf("transport: %s answered %s", f.bases[idx].Host, resp.Status)
			if expired {
				err = fmt.Errorf("transport: %s did not answer within its share of the deadline", f.bases[idx].Host)
			}
		} else if expired {
			err = fmt.Errorf("transport: %s did not answer within its share of the deadline: %w", f.bases[idx].Host, err)
		}
		lastErr = err
		tried = append(tried, instanceErr(f.bases[idx], err))
		// Later calls start at the next instance: this one failed. Only if
		// no other call moved on (or back) meanwhile.
		f.current.CompareAndSwap(int32(idx), int32((idx+1)%n))
		if !safe && !unsent(err) {
			// The outcome is unknown: the caller decides, from this error
			// alone (the earlier instances' were never sent, so they say
			// nothing of what this call did).
			return nil, err
		}
	}
	// Every instance failed: never sent, or a call safe to repeat. A
	// *url.Error, as http.Client.Do returns, since Connect clients unwrap
	// the first one they find (errors.As): one of the instances' own
	// would be taken for the whole.
	return nil, &url.Error{Op: req.Method, URL: req.URL.Redacted(), Err: &allFailed{tried}}
}

// allFailed is what no instance answering is: each one's failure, in the
// order tried, each naming its instance. errors.Is and errors.As see every
// one.
type allFailed struct{ errs []error }

func (e *allFailed) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("none of %d instances answered: %s", len(e.errs), strings.Join(msgs, "; "))
}

func (e *allFailed) Unwrap() []error { return e.errs }

// retarget is a copy of req sent to instance idx: its base URL in place of
// the first instance's, the procedure path kept. A copy, since a client
// must not change the request it was given, and a second try sets its own
// body.
func (f *Failover) retarget(req *http.Request, idx int) *http.Request {
	r := req.Clone(req.Context())
	b := f.bases[idx]
	r.URL.Scheme, r.URL.Host = b.Scheme, b.Host
	r.URL.Path = strings.TrimRight(b.Path, "/") + strings.TrimPrefix(req.URL.Path, strings.TrimRight(f.bases[0].Path, "/"))
	r.URL.RawPath = ""
	r.Host = b.Host
	return r
}

// share bounds one try's wait for response headers (withShare).
type share struct {
	timer  *time.Timer
	fired  atomic.Bool
	cancel context.CancelFunc
}

// withShare bounds req's wait for response headers by an equal share of
// what is left of its deadline among the left instances still to try. A
// call without a deadline is not bounded (nil share): then only a failure
// moves it on.
func withShare(req *http.Request, left int) (*http.Request, *share) {
	deadline, ok := req.Context().Deadline()
	if !ok {
		return req, nil
	}
	ctx, cancel := context.WithCancel(req.Context())
	s := &share{cancel: cancel}
	s.timer = time.AfterFunc(time.Until(deadline)/time.Duration(left), func() {
		s.fired.Store(true)
		cancel()
	})
	return req.WithContext(ctx), s
}

// end is called once the try returned, and reports whether its share ran
// out. A response that arrived in time keeps its body readable until it is
// closed, however long that is (a stream); anything else ends the try's
// context now.
func (s *share) end(resp *http.Response, err error) bool {
	if s == nil {
		return false
	}
	if s.timer.Stop() && err == nil {
		resp.Body = cancelOnClose{resp.Body, s.cancel}
		return false
	}
	s.cancel()
	return s.fired.Load()
}

// cancelOnClose ends a try's context when its response body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// unsent reports whether err means the request never reached a server:
// the connection to it could not be made.
func unsent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// instanceErr is err, one instance's failure, as allFailed lists it: the
// instance's base URL, then what failed, without the *url.Error that
// http.Client.Do wraps it in (it names the whole request URL, and Connect
// clients would unwrap it, see Do).
func instanceErr(base *url.URL, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("%s: %w", base.Redacted(), err)
}
