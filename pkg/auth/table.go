package auth

import (
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Role is what a certificate's holder may do.
type Role string

// The roles. A certificate may carry several (an operator's tenurectl
// certificate usually also carries producer and consumer).
const (
	// RoleReplica: a replica process. Fetches from peers (the leader
	// checks who fetches by the request's replica id, and this role is
	// what a follower needs); its own lease session.
	RoleReplica Role = "replica"
	// RolePromoter: fences, truncates, adopts and drops ranges on replicas,
	// grants and binds epochs, steps membership.
	RolePromoter Role = "promoter"
	// RoleProducer: appends.
	RoleProducer Role = "producer"
	// RoleConsumer: reads and tails.
	RoleConsumer Role = "consumer"
	// RoleOperator: creates and deletes ranges, changes membership and
	// promotes through the promoter, reads every status.
	RoleOperator Role = "operator"
)

// Roles lists every role, in the order `tenure certs init` issues them.
var Roles = []Role{RoleReplica, RolePromoter, RoleProducer, RoleConsumer, RoleOperator}

// Table is every procedure tenure serves and the roles it admits: the whole
// authorisation policy, in one place. A procedure missing from it is
// refused to everyone (PermissionDenied), so a new RPC is closed until
// someone decides who may call it here.
var Table = map[string][]Role{
	// LogService: clients of the log.
	tenurev1connect.LogServiceAppendProcedure:       {RoleProducer},
	tenurev1connect.LogServiceAppendStreamProcedure: {RoleProducer},
	tenurev1connect.LogServiceReadProcedure:         {RoleConsumer},
	tenurev1connect.LogServiceTailProcedure:         {RoleConsumer},

	// ReplicaService: replication between replicas, and the promoter's
	// commands. Fence, Truncate and Adopt are exactly what an attacker
	// would use to brick a range or mark records committed that never
	// were: only the promoter.
	tenurev1connect.ReplicaServiceFetchProcedure:        {RoleReplica},
	tenurev1connect.ReplicaServiceFetchStreamProcedure:  {RoleReplica},
	tenurev1connect.ReplicaServiceFetchSessionProcedure: {RoleReplica},
	tenurev1connect.ReplicaServiceFenceProcedure:        {RolePromoter},
	tenurev1connect.ReplicaServiceFenceRangesProcedure:  {RolePromoter},
	tenurev1connect.ReplicaServiceTruncateProcedure:     {RolePromoter},
	tenurev1connect.ReplicaServiceAdoptProcedure:        {RolePromoter},
	tenurev1connect.ReplicaServiceAdoptRangesProcedure:  {RolePromoter},
	tenurev1connect.ReplicaServiceDropRangeProcedure:    {RolePromoter},
	// A leader confirms with its followers that it still leads before it
	// serves a read (readindex.go): replicas read each other's status. A
	// producer or consumer asks it which replica serves as leader now (the
	// lease service's holder may be one that lost its lease): tenurectl
	// produce and consume do.
	tenurev1connect.ReplicaServiceGetStatusProcedure:       {RoleReplica, RolePromoter, RoleOperator, RoleProducer, RoleConsumer},
	tenurev1connect.ReplicaServiceGetEpochHistoryProcedure: {RolePromoter, RoleOperator},

	// LeaseService: epochs, leases and membership.
	tenurev1connect.LeaseServiceCreateRangeProcedure: {RoleOperator},
	tenurev1connect.LeaseServiceSetReplicasProcedure: {RoleOperator},
	// Retention decides what is deleted: an operator's call, like the
	// replica set (tenurectl range set).
	tenurev1connect.LeaseServiceSetRetentionProcedure:             {RoleOperator},
	tenurev1connect.LeaseServiceChangeMembershipProcedure:         {RolePromoter},
	tenurev1connect.LeaseServiceCompleteMembershipChangeProcedure: {RolePromoter},
	tenurev1connect.LeaseServiceDeleteRangeProcedure:              {RolePromoter},
	// A range's replicas and lease holder are where its leader is: a
	// producer or consumer locates the leader here and with the replicas'
	// GetStatus (tenurectl produce and consume do), as Kafka's clients
	// read a topic's metadata. Without both, the producer and consumer
	// certificates `tenure certs init` issues could not produce or consume
	// with tenurectl at all.
	// GetRanges (several named ranges at once) and GetLease (a named
	// range's lease alone) read nothing GetRange does not: a client
	// following its ranges' leaders may batch or narrow the same question.
	// Listing every range (ListRanges) and watching every lease
	// (WatchLeases) stay an operator's: they name ranges the caller did
	// not name.
	tenurev1connect.LeaseServiceGetRangeProcedure:    {RoleReplica, RolePromoter, RoleOperator, RoleProducer, RoleConsumer},
	tenurev1connect.LeaseServiceGetRangesProcedure:   {RoleReplica, RolePromoter, RoleOperator, RoleProducer, RoleConsumer},
	tenurev1connect.LeaseServiceListRangesProcedure:  {RoleReplica, RolePromoter, RoleOperator},
	tenurev1connect.LeaseServiceGetLeaseProcedure:    {RoleReplica, RolePromoter, RoleOperator, RoleProducer, RoleConsumer},
	tenurev1connect.LeaseServiceWatchLeasesProcedure: {RolePromoter, RoleOperator},
	tenurev1connect.LeaseServiceGrantEpochProcedure:  {RolePromoter},
	tenurev1connect.LeaseServiceGrantEpochsProcedure: {RolePromoter},
	tenurev1connect.LeaseServiceBindLeaseProcedure:   {RolePromoter},
	tenurev1connect.LeaseServiceBindLeasesProcedure:  {RolePromoter},
	// Sessions: a replica's own (OpenSession checks the holder id against
	// the certificate's replica id), and the promoter's.
	tenurev1connect.LeaseServiceOpenSessionProcedure:  {RoleReplica, RolePromoter},
	tenurev1connect.LeaseServiceKeepAliveProcedure:    {RoleReplica, RolePromoter},
	tenurev1connect.LeaseServiceCloseSessionProcedure: {RoleReplica, RolePromoter},
	tenurev1connect.LeaseServiceReleaseLeaseProcedure: {RoleReplica, RolePromoter},

	// PromoterService: operators. A standby promoter forwards an
	// operator's request to the elected one with its own certificate,
	// once its own server admitted the operator's (services/promoter,
	// forward.go): the elected one admits the promoter role too. That is
	// no new power: a promoter fences, truncates and grants epochs anyway.
	tenurev1connect.PromoterServicePromoteProcedure:         {RoleOperator, RolePromoter},
	tenurev1connect.PromoterServiceChangeReplicasProcedure:  {RoleOperator, RolePromoter},
	tenurev1connect.PromoterServiceDeleteRangeProcedure:     {RoleOperator, RolePromoter},
	tenurev1connect.PromoterServiceListTransitionsProcedure: {RoleOperator, RolePromoter},
	tenurev1connect.PromoterServiceGetStatusProcedure:       {RoleOperator, RolePromoter},
}

// Paths outside the tenure services.
const (
	// healthPrefix is gRPC health: open to probes without a certificate.
	healthPrefix = "/grpc.health.v1.Health/"
	// reflectionPrefixes are gRPC reflection: operators only.
	reflectionV1      = "/grpc.reflection.v1.ServerReflection/"
	reflectionV1Alpha = "/grpc.reflection.v1alpha.ServerReflection/"
)
