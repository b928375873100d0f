/*
 * rdmacm_layout.c: the layout of librdmacm's public structures, as a C compiler sees the
 * installed rdma/rdma_cma.h (librdmacm-dev). Prints "NAME SIZE" for each structure and
 * "NAME.FIELD OFFSET" for each of its fields (members of anonymous unions under their C
 * names); tests/rdmacm_layout.rs compares every line with the shim's cma_ffi bindings.
 *
 *   cc -O1 -Wall -Werror rdmacm_layout.c -o rdmacm_layout && ./rdmacm_layout
 */
#include <stddef.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

#define SIZE(type) printf("%s %zu\n", #type, sizeof(struct type))
#define FIELD(type, field) printf("%s.%s %zu\n", #type, #field, offsetof(struct type, field))

int main(void)
{
	SIZE(rdma_cm_id);
	FIELD(rdma_cm_id, verbs);
	FIELD(rdma_cm_id, channel);
	FIELD(rdma_cm_id, context);
	FIELD(rdma_cm_id, qp);
	FIELD(rdma_cm_id, route);
	FIELD(rdma_cm_id, ps);
	FIELD(rdma_cm_id, port_num);
	FIELD(rdma_cm_id, event);
	FIELD(rdma_cm_id, send_cq_channel);
	FIELD(rdma_cm_id, send_cq);
	FIELD(rdma_cm_id, recv_cq_channel);
	FIELD(rdma_cm_id, recv_cq);
	FIELD(rdma_cm_id, srq);
	FIELD(rdma_cm_id, pd);
	FIELD(rdma_cm_id, qp_type);

	SIZE(rdma_cm_event);
	FIELD(rdma_cm_event, id);
	FIELD(rdma_cm_event, listen_id);
	FIELD(rdma_cm_event, event);
	FIELD(rdma_cm_event, status);
	FIELD(rdma_cm_event, param);
	FIELD(rdma_cm_event, param.conn);
	FIELD(rdma_cm_event, param.ud);

	SIZE(rdma_conn_param);
	FIELD(rdma_conn_param, private_data);
	FIELD(rdma_conn_param, private_data_len);
	FIELD(rdma_conn_param, responder_resources);
	FIELD(rdma_conn_param, initiator_depth);
	FIELD(rdma_conn_param, flow_control);
	FIELD(rdma_conn_param, retry_count);
	FIELD(rdma_conn_param, rnr_retry_count);
	FIELD(rdma_conn_param, srq);
	FIELD(rdma_conn_param, qp_num);

	SIZE(rdma_ud_param);
	FIELD(rdma_ud_param, private_data);
	FIELD(rdma_ud_param, private_data_len);
	FIELD(rdma_ud_param, ah_attr);
	FIELD(rdma_ud_param, qp_num);
	FIELD(rdma_ud_param, qkey);

	SIZE(rdma_event_channel);
	FIELD(rdma_event_channel, fd);

	SIZE(rdma_addrinfo);
	FIELD(rdma_addrinfo, ai_flags);
	FIELD(rdma_addrinfo, ai_family);
	FIELD(rdma_addrinfo, ai_qp_type);
	FIELD(rdma_addrinfo, ai_port_space);
	FIELD(rdma_addrinfo, ai_src_len);
	FIELD(rdma_addrinfo, ai_dst_len);
	FIELD(rdma_addrinfo, ai_src_addr);
	FIELD(rdma_addrinfo, ai_dst_addr);
	FIELD(rdma_addrinfo, ai_src_canonname);
	FIELD(rdma_addrinfo, ai_dst_canonname);
	FIELD(rdma_addrinfo, ai_route_len);
	FIELD(rdma_addrinfo, ai_route);
	FIELD(rdma_addrinfo, ai_connect_len);
	FIELD(rdma_addrinfo, ai_connect);
	FIELD(rdma_addrinfo, ai_next);

	SIZE(rdma_route);
	FIELD(rdma_route, addr);
	FIELD(rdma_route, path_rec);
	FIELD(rdma_route, num_paths);

	SIZE(rdma_addr);
	FIELD(rdma_addr, src_addr);
	FIELD(rdma_addr, src_sin);
	FIELD(rdma_addr, src_sin6);
	FIELD(rdma_addr, src_storage);
	FIELD(rdma_addr, dst_addr);
	FIELD(rdma_addr, dst_sin);
	FIELD(rdma_addr, dst_sin6);
	FIELD(rdma_addr, dst_storage);
	FIELD(rdma_addr, addr);
	FIELD(rdma_addr, addr.ibaddr);

	SIZE(rdma_ib_addr);
	FIELD(rdma_ib_addr, sgid);
	FIELD(rdma_ib_addr, dgid);
	FIELD(rdma_ib_addr, pkey);

	SIZE(ibv_sa_path_rec);
	FIELD(ibv_sa_path_rec, dgid);
	FIELD(ibv_sa_path_rec, sgid);
	FIELD(ibv_sa_path_rec, dlid);
	FIELD(ibv_sa_path_rec, slid);
	FIELD(ibv_sa_path_rec, raw_traffic);
	FIELD(ibv_sa_path_rec, flow_label);
	FIELD(ibv_sa_path_rec, hop_limit);
	FIELD(ibv_sa_path_rec, traffic_class);
	FIELD(ibv_sa_path_rec, reversible);
	FIELD(ibv_sa_path_rec, numb_path);
	FIELD(ibv_sa_path_rec, pkey);
	FIELD(ibv_sa_path_rec, sl);
	FIELD(ibv_sa_path_rec, mtu_selector);
	FIELD(ibv_sa_path_rec, mtu);
	FIELD(ibv_sa_path_rec, rate_selector);
	FIELD(ibv_sa_path_rec, rate);
	FIELD(ibv_sa_path_rec, packet_life_time_selector);
	FIELD(ibv_sa_path_rec, packet_life_time);
	FIELD(ibv_sa_path_rec, preference);

	SIZE(rdma_cm_join_mc_attr_ex);
	FIELD(rdma_cm_join_mc_attr_ex, comp_mask);
	FIELD(rdma_cm_join_mc_attr_ex, join_flags);
	FIELD(rdma_cm_join_mc_attr_ex, addr);

	return ferror(stdout) ? 1 : 0;
}
