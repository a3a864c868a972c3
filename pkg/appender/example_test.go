package appender_test

import (
	"context"
	"fmt"
	"log"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/leaseclient"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// A producer service appends to range "orders" wherever it is led: it
// starts at any member, follows not-leader answers, and after a leader
// crash finds the new leader through the lease service and sends the
// append there again with the same producer sequence (written once).
// Under mutual TLS, call transport.SetTLS first with a certificate of the
// producer role (pkg/auth) and pass https:// URLs.
func ExampleLocateLeader() {
	hc := transport.NewHTTPClient()
	lc, err := leaseclient.New(hc, []string{"http://127.0.0.1:7000"})
	if err != nil {
		log.Fatal(err)
	}
	dial := func(url string) tenurev1connect.LogServiceClient {
		return tenurev1connect.NewLogServiceClient(hc, url, transport.ClientOptions()...)
	}
	a := appender.New(dial("http://127.0.0.1:7101"),
		appender.FollowLeader(dial), appender.LocateLeader(appender.LeaseLeader(lc)))
	defer a.Close()
	ack, err := a.Append(context.Background(), "orders", [][]byte{[]byte("order-1")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed at offset", ack.GetBaseOffset())
}
