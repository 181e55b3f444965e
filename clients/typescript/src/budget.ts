/** Default budget: ten retries in reserve, one earned back per ten answers. */
export const defaultBudgetCapacity = 10;
export const defaultRetryCost = 1;
export const defaultBudgetRefill = 0.1;

/**
 * Budget is a client's retry budget: a token bucket shared by every
 * operation of one Client (or of several, given the same Budget). A retry
 * spends `retryCost` tokens; an answer the server gave (any status that is
 * not retried) puts `refill` tokens back, up to `capacity`. First attempts
 * are never charged. So while the server is healthy the bucket stays full,
 * and during an outage the whole client adds at most about
 * capacity/retryCost retries to its callers' first attempts, instead of
 * multiplying its load by the number of attempts per operation. The Go
 * client's `Budget` is the same bucket with the same defaults.
 */
export class Budget {
  #tokens: number;
  readonly capacity: number;
  readonly retryCost: number;
  readonly refill: number;

  /** A full bucket. Values not above zero take the defaults. */
  constructor(capacity = 0, retryCost = 0, refill = 0) {
    this.capacity = capacity > 0 ? capacity : defaultBudgetCapacity;
    this.retryCost = retryCost > 0 ? retryCost : defaultRetryCost;
    this.refill = refill > 0 ? refill : defaultBudgetRefill;
    this.#tokens = this.capacity;
  }

  /** The tokens left, for metrics and tests. */
  get tokens(): number {
    return this.#tokens;
  }

  /** Spends one retry's tokens; false: exhausted, the retry must not be sent. */
  take(): boolean {
    if (this.#tokens < this.retryCost) {
      return false;
    }
    this.#tokens -= this.retryCost;
    return true;
  }

  /** Earns tokens back: the server answered without asking for a retry. */
  answered(): void {
    this.#tokens = Math.min(this.capacity, this.#tokens + this.refill);
  }
}
