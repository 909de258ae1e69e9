import { inspect } from "node:util";
import { Http, type ClientOptions } from "./http.js";
import type { RunList } from "./types.js";

/** What {@link Operator.listRuns} asks for; every field is optional. */
export interface RunQuery {
  /** Most runs to answer (1–200; the server's default 50). */
  limit?: number;
  /** The `next_cursor` of the page before. */
  after?: string;
  /** `running`, `completed`, `failed` or `cancelled`. */
  status?: "running" | "completed" | "failed" | "cancelled";
  /** Only this owner's runs (exact). */
  owner?: string;
  /** Only runs whose id starts with this. */
  q?: string;
  /** The project to list (an operator token without a project only). */
  project_id?: string;
}

/** A connection to one Tollgate server as one operator (its JWT, `options.token`). */
export class Operator {
  readonly #http: Http;
  readonly #token: string;

  constructor(baseUrl: string, options: ClientOptions) {
    if (typeof options?.token !== "string" || options.token.trim() === "") {
      throw new TypeError("the operator token is empty");
    }
    this.#http = new Http(baseUrl, options);
    this.#token = options.token.trim();
  }

  /**
   * One page of the project's runs, newest first (`GET /api/runs`): `status` and `owner`
   * match exactly, `q` is a run-id prefix, `after` the previous page's `next_cursor`. A
   * page may be short, even empty, while `has_more` is true.
   */
  async listRuns(query: RunQuery = {}, init: { signal?: AbortSignal } = {}): Promise<RunList> {
    const { body } = await this.#http.json<RunList>(
      "GET",
      this.#http.url(["api", "runs"], { ...query }),
      this.#token,
      [200],
      undefined,
      init.signal,
    );
    return body;
  }

  [inspect.custom](): string {
    return `Operator { baseUrl: '${this.#http.base.href}' }`;
  }
}
