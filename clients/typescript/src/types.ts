// The contract's types under their schema names. api.gen.ts is generated
// from openapi.yaml by openapi-typescript (make generate; make verify fails
// when it is stale), so the client cannot drift from the contract.
import type { components, operations } from "./api.gen.js";

type Schemas = components["schemas"];

export type Order = Schemas["Order"];
export type OrderList = Schemas["OrderList"];
export type CreateOrderRequest = Schemas["CreateOrderRequest"];
export type UpdateOrderRequest = Schemas["UpdateOrderRequest"];
export type Customer = Schemas["Customer"];
export type PutCustomerRequest = Schemas["PutCustomerRequest"];
export type Payment = Schemas["Payment"];
export type PaymentList = Schemas["PaymentList"];
export type CreatePaymentRequest = Schemas["CreatePaymentRequest"];
export type Refund = Schemas["Refund"];
export type CreateRefundRequest = Schemas["CreateRefundRequest"];
export type IdempotencyKeyStatus = Schemas["IdempotencyKeyStatus"];
export type Problem = Schemas["Problem"];

export type ListOrdersParams = NonNullable<operations["listOrders"]["parameters"]["query"]>;
export type ListPaymentsParams = NonNullable<operations["listPayments"]["parameters"]["query"]>;

/**
 * The endpoints as the server scopes keys (method plus route template);
 * the key-status lookup takes them.
 */
export type Endpoint = operations["getIdempotencyKey"]["parameters"]["query"]["endpoint"];

export const endpointCreateOrder = "POST /v1/orders" satisfies Endpoint;
export const endpointCreatePayment = "POST /v1/payments" satisfies Endpoint;
export const endpointCreateRefund = "POST /v1/payments/{id}/refunds" satisfies Endpoint;
